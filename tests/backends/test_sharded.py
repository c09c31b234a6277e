"""FSDP2-sharded trainer ranks on real processes (gloo on loopback): two sharded ranks train exactly
what one process trains (full fine-tune and LoRA, clipping on), each holds only its shard, and rank
0's gathered copy is the trained policy. Checkpoints crossing between sharded and single-process runs,
and the non-finite guard, are checked for both layouts in tests/backends/test_data_parallel.py."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")
pytest.importorskip("peft")

from support.dp_rig import make_batch, make_trainer, max_diff, one_rank, parity_tolerance, spawn_ranks, weights  # noqa: E402

pytestmark = [pytest.mark.train, pytest.mark.slow]  # each test spawns two rank processes: 20-40 s on 2 cores

# 11 rollouts → PPO minibatches of 6 and 5 → shares 3/3 and 3/2 → micro-batches 2+1 and 2+1 / 2+0:
# rank 1 runs a filler pass in the second minibatch. A low clip bound makes clipping act.
SHAPE = {"ppo_n_minibatches": 2, "micro_batch": 2, "max_grad_norm": 0.05}
FSDP = {**SHAPE, "shard": "fsdp"}
CALLS = 3  # trainer calls per comparison: 6 optimizer steps


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    from rlvr.backends.model.tiny import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "base", hidden=32, layers=2, heads=2, seed=0)


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_two_sharded_ranks_train_what_one_process_trains(base, lora, tmp_path):
    batch = make_batch(shared_prompts=False)
    ranks = spawn_ranks(2, base, lora, [("train", batch)] * CALLS, tmp_path, **FSDP)
    # Sharded ranks read every row's prompt (shared_prefix.py's two forwards could differ between
    # ranks); the reference reads them the same way, so the comparison is of sharding alone.
    reference, metrics = one_rank(base, lora, [batch] * CALLS, share_prompts=False, **SHAPE)
    start = weights(make_trainer(base, lora))
    tolerance = parity_tolerance(base, [batch], CALLS * SHAPE["ppo_n_minibatches"])

    assert max_diff(weights(reference), start) > 10 * tolerance  # the steps moved the weights: a real comparison
    assert metrics[0]["train/grad_norm"] > SHAPE["max_grad_norm"]  # clipping acted
    assert max_diff(ranks[0]["weights"], weights(reference)) < tolerance
    assert max_diff(ranks[0]["gathered"], weights(reference)) < tolerance  # what a lane publishes
    assert ranks[0]["version"] == ranks[1]["version"] == reference.version == 3
    full = {n: p.numel() for n, p in reference.policy.model.named_parameters()}
    for n, local in ranks[1]["shards"].items():  # every rank holds about half of each parameter
        assert local <= -(-full[n] // 2), n
    for got, want in zip(ranks[0]["metrics"], metrics, strict=True):
        assert got.keys() == want.keys()
        assert all(got[k] == pytest.approx(want[k], rel=1e-4, abs=1e-6) for k in want)
