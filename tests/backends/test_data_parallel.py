"""The data-parallel trainer on real rank processes (gloo on loopback): two ranks train exactly
what one process trains, keep identical weights, and checkpoint in a layout any number of ranks
resumes from. The one-rank reference is the plain :class:`TorchTrainer` in this process."""

from __future__ import annotations

import os

import pytest

pytest.importorskip("torch")
pytest.importorskip("peft")

import torch  # noqa: E402

from rlvr.backends.train.distributed import rank_share, ranks_from_env  # noqa: E402
from rlvr.backends.train.trainer import TorchTrainer, component_units  # noqa: E402
from support.dp_rig import make_batch, make_trainer, max_diff, one_rank, parity_tolerance, spawn_ranks, weights  # noqa: E402

pytestmark = pytest.mark.train
# Each of these spawns two rank processes that import torch and train: 20-30 s apiece on 2 cores.
spawns = pytest.mark.slow

# PPO minibatches and micro-batches on: 11 rollouts → minibatches of 6 and 5 → shares 3/3 and 3/2,
# each cut into micro-batches of 2, so every normalisation path is crossed.
SHAPE = {"ppo_n_minibatches": 2, "micro_batch": 2}
# The checkpoint and non-finite paths hold for both layouts of the ranks' weights (FSDP2-specific
# checks: tests/backends/test_sharded.py).
MODES = {"replicate": SHAPE, "fsdp": {**SHAPE, "shard": "fsdp"}}
CALLS = 3  # trainer calls per comparison: 6 optimizer steps
STEPS = CALLS * SHAPE["ppo_n_minibatches"]


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    from rlvr.backends.model.tiny import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "base", hidden=32, layers=2, heads=2, seed=0)


@spawns
@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_two_ranks_train_what_one_process_trains(base, lora, tmp_path):
    batch = make_batch()
    ranks = spawn_ranks(2, base, lora, [("train", batch)] * CALLS, tmp_path, **SHAPE)
    reference, metrics = one_rank(base, lora, [batch] * CALLS, **SHAPE)
    start = weights(make_trainer(base, lora))
    tolerance = parity_tolerance(base, [batch], STEPS)

    assert max_diff(weights(reference), start) > 10 * tolerance  # the steps moved the weights: a real comparison
    assert all(torch.equal(ranks[0]["weights"][k], ranks[1]["weights"][k]) for k in ranks[0]["weights"])
    assert max_diff(ranks[0]["weights"], weights(reference)) < tolerance
    assert ranks[0]["version"] == ranks[1]["version"] == reference.version == 3
    assert ranks[0]["threads"] == ranks[1]["threads"] == max(1, len(os.sched_getaffinity(0)) // 2)
    for got, want in zip(ranks[0]["metrics"], metrics, strict=True):
        assert got.keys() == want.keys()
        assert all(got[k] == pytest.approx(want[k], rel=1e-4, abs=1e-6) for k in want)


@spawns
@pytest.mark.parametrize("mode", MODES)
def test_a_checkpoint_of_two_ranks_resumes_on_one_and_the_reverse(base, tmp_path, mode):
    batches = [make_batch(seed=s, step=s + 1) for s in range(CALLS)]
    uninterrupted, _ = one_rank(base, False, batches, **SHAPE)
    tolerance = parity_tolerance(base, batches, STEPS)

    # 2 → 1 (full fine-tune): the 2-rank run saves after step 1; one process continues.
    spawn_ranks(2, base, False, [("train", batches[0]), ("save", str(tmp_path / "two"))], tmp_path / "a", **MODES[mode])
    resumed, _ = one_rank(base, False, batches[1:], load=tmp_path / "two", **SHAPE)
    assert resumed.version == 3
    assert max_diff(weights(resumed), weights(uninterrupted)) < tolerance

    # 1 → 2 (LoRA): one process saves after step 1; two ranks load and continue.
    lora_full, _ = one_rank(base, True, batches, save=tmp_path / "one", **SHAPE)
    ranks = spawn_ranks(2, base, True, [("load", str(tmp_path / "one")), ("train", batches[1]),
                                        ("train", batches[2])], tmp_path / "b", **MODES[mode])
    assert ranks[0]["version"] == ranks[1]["version"] == 3
    assert max_diff(ranks[1]["weights"], weights(lora_full)) < tolerance


@spawns
@pytest.mark.parametrize("mode", MODES)
def test_a_non_finite_loss_on_one_rank_skips_the_step_on_every_rank(base, tmp_path, mode):
    # Rollout 10 lies in rank 1's share of the second minibatch: only rank 1 sees the NaN.
    poisoned, clean = make_batch(poison=10), make_batch(seed=1, step=2)
    ranks = spawn_ranks(2, base, True, [("train", poisoned), ("train", clean)], tmp_path, **MODES[mode])
    reference, metrics = one_rank(base, True, [poisoned, clean], **SHAPE)

    first = ranks[0]["metrics"][0]
    assert first["train/skipped"] == metrics[0]["train/skipped"] == 1.0
    assert first["train/optimizer_steps"] == 1.0
    assert all(torch.equal(ranks[0]["weights"][k], ranks[1]["weights"][k]) for k in ranks[0]["weights"])
    tolerance = parity_tolerance(base, [poisoned, clean], 2 * SHAPE["ppo_n_minibatches"])
    assert max_diff(ranks[1]["weights"], weights(reference)) < tolerance


def test_shares_cover_the_minibatch_in_order_and_a_group_of_one_is_no_group():
    for n in range(0, 9):
        for world in (1, 2, 3):
            covered = [i for r in range(world) for i in range(n)[rank_share(n, r, world)]]
            assert covered == list(range(n))
    assert ranks_from_env({"WORLD_SIZE": "1", "RANK": "0"}) is None
    assert ranks_from_env({"WORLD_SIZE": "2", "RANK": "1", "LOCAL_RANK": "1"}).rank == 1


class _DroppedMicroBatch(TorchTrainer):
    """A bug: each minibatch's last micro-batch is never trained."""

    def _chunks(self, rollouts):
        chunks = super()._chunks(rollouts)
        return chunks[:-1] if len(chunks) > 1 else chunks


class _LocalNormalisation(TorchTrainer):
    """A bug: each micro-batch divided by its own token count, as a rank normalising its share alone would."""

    def _chunks(self, rollouts):
        chunks = super()._chunks(rollouts)
        for i, chunk in enumerate(chunks):
            chunk.denominators = component_units(rollouts[i * self.micro_batch:(i + 1) * self.micro_batch],
                                                    self.loss.aggregation)
        return chunks


def test_the_parity_tolerance_holds_another_summation_order_and_not_a_bug(base):
    # What the rank tests compare, in one process: another micro-batch size is the same gradient
    # summed in another order (within the tolerance, on whatever CPU runs this); a bug changes the
    # gradient's direction and moves weights by a good part of a step (far outside it).
    batch = make_batch()
    tolerance = parity_tolerance(base, [batch], STEPS)
    reference, _ = one_rank(base, True, [batch] * CALLS, **SHAPE)

    def trained(cls=None, micro_batch=SHAPE["micro_batch"]):
        trainer = make_trainer(base, True, cls, ppo_n_minibatches=SHAPE["ppo_n_minibatches"], micro_batch=micro_batch)
        for _ in range(CALLS):
            trainer(batch)
        return max_diff(weights(trainer), weights(reference))

    assert 1e-4 < tolerance < 1e-3  # a tenth of a step (lr 1e-2): see parity_tolerance
    assert trained(micro_batch=3) < tolerance
    assert trained(_DroppedMicroBatch) > 20 * tolerance
    assert trained(_LocalNormalisation) > 20 * tolerance
