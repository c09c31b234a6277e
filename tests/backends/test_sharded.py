"""FSDP2-sharded trainer ranks on real processes (gloo on loopback): two sharded ranks train exactly
what one process trains (full fine-tune and LoRA, clipping on), each holds only its shard, rank 0's
gathered copy is the trained policy, and checkpoints cross between sharded and single-process runs."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")
pytest.importorskip("peft")

import torch  # noqa: E402

from dp_rig import make_batch, make_trainer, max_diff, spawn_ranks, weights  # noqa: E402

pytestmark = [pytest.mark.train, pytest.mark.slow]  # each test spawns two rank processes: 20-40 s on 2 cores

# 11 rollouts → PPO minibatches of 6 and 5 → shares 3/3 and 3/2 → micro-batches 2+1 and 2+1 / 2+0:
# rank 1 runs a filler pass in the second minibatch. A low clip bound makes clipping act.
SHAPE = {"ppo_n_minibatches": 2, "micro_batch": 2, "max_grad_norm": 0.05}
FSDP = {**SHAPE, "shard": "fsdp"}


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    from rlvr.backends.model.tiny import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "base", hidden=32, layers=2, heads=2, seed=0)


def one_rank(base, lora, batches, load=None, save=None):
    trainer = make_trainer(base, lora, **SHAPE)
    if load is not None:
        trainer.load(str(load))
    metrics = [trainer(batch) for batch in batches[:1]]
    if save is not None:
        trainer.save(str(save))
    metrics += [trainer(batch) for batch in batches[1:]]
    return trainer, metrics


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_two_sharded_ranks_train_what_one_process_trains(base, lora, tmp_path):
    batch = make_batch()
    ranks = spawn_ranks(2, base, lora, [("train", batch)] * 3, tmp_path, **FSDP)
    reference, metrics = one_rank(base, lora, [batch] * 3)
    start = weights(make_trainer(base, lora))

    assert max_diff(weights(reference), start) > 1e-3  # the steps moved the weights: a real comparison
    assert metrics[0]["train/grad_norm"] > SHAPE["max_grad_norm"]  # clipping acted
    assert max_diff(ranks[0]["weights"], weights(reference)) < 1e-5
    assert max_diff(ranks[0]["gathered"], weights(reference)) < 1e-5  # what a lane publishes
    assert ranks[0]["version"] == ranks[1]["version"] == reference.version == 3
    full = {n: p.numel() for n, p in reference.policy.model.named_parameters()}
    for n, local in ranks[1]["shards"].items():  # every rank holds about half of each parameter
        assert local <= -(-full[n] // 2), n
    for got, want in zip(ranks[0]["metrics"], metrics, strict=True):
        assert got.keys() == want.keys()
        assert all(got[k] == pytest.approx(want[k], rel=1e-4, abs=1e-6) for k in want)


def test_a_sharded_checkpoint_resumes_on_one_process_and_the_reverse(base, tmp_path):
    batches = [make_batch(seed=s, step=s + 1) for s in range(3)]
    uninterrupted, _ = one_rank(base, False, batches)

    # 2 sharded → 1 (full fine-tune): the 2-rank run saves after step 1; one process continues.
    spawn_ranks(2, base, False, [("train", batches[0]), ("save", str(tmp_path / "two"))], tmp_path / "a", **FSDP)
    resumed, _ = one_rank(base, False, batches[1:], load=tmp_path / "two")
    assert resumed.version == 3
    assert max_diff(weights(resumed), weights(uninterrupted)) < 1e-5

    # 1 → 2 sharded (LoRA): one process saves after step 1; two sharded ranks load and continue.
    lora_full, _ = one_rank(base, True, batches, save=tmp_path / "one")
    ranks = spawn_ranks(2, base, True, [("load", str(tmp_path / "one")), ("train", batches[1]),
                                        ("train", batches[2])], tmp_path / "b", **FSDP)
    assert ranks[0]["version"] == ranks[1]["version"] == 3
    assert max_diff(ranks[1]["weights"], weights(lora_full)) < 1e-5


def test_a_non_finite_loss_on_one_sharded_rank_skips_the_step_on_every_rank(base, tmp_path):
    # Rollout 10 lies in rank 1's share of the second minibatch: only rank 1 computes the NaN.
    poisoned, clean = make_batch(poison=10), make_batch(seed=1, step=2)
    ranks = spawn_ranks(2, base, True, [("train", poisoned), ("train", clean)], tmp_path, **FSDP)
    reference, metrics = one_rank(base, True, [poisoned, clean])

    assert ranks[0]["metrics"][0]["train/skipped"] == metrics[0]["train/skipped"] == 1.0
    assert ranks[0]["metrics"][0]["train/optimizer_steps"] == 1.0
    assert max_diff(ranks[1]["weights"], weights(reference)) < 1e-5
    assert torch.isfinite(torch.cat([w.flatten() for w in ranks[0]["weights"].values()])).all()
