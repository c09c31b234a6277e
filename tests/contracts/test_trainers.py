"""The trainer contract, run over every trainer: the fake and the torch trainer (LoRA and full
fine-tune). A trainer takes a :class:`~rlvr.types.Batch`, returns numeric metrics, moves the policy
version by one per step, and, when it checkpoints, resumes to exactly where it was."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping

import pytest

from rlvr.data.tasks import load_tasks
from rlvr.errors import RLVRError
from rlvr.testing import FakeSampler, FakeTrainer, batch_of, make_rows
from rlvr.types import Batch, Group

TRAINERS = ["fake", "torch_lora", "torch_full"]


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    pytest.importorskip("torch")
    from rlvr.backends.model.tiny import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "base", hidden=32, layers=2, heads=2, seed=0)


@pytest.fixture(params=TRAINERS)
def make(request):
    """A factory of fresh, identical trainers, and a function reading a trainer's weights."""
    if request.param == "fake":
        return FakeTrainer, lambda trainer: {"version": trainer.version}, batches(FakeSampler(skill=0.5, seed=0))
    pytest.importorskip("peft")
    from rlvr.backends.model.policy import LoraSpec, Policy
    from rlvr.backends.sample.batched import TransformersSampler
    from rlvr.backends.train.trainer import TorchTrainer

    base = request.getfixturevalue("base")
    lora = LoraSpec(rank=4, alpha=8.0) if request.param == "torch_lora" else None

    def fresh():
        return TorchTrainer(Policy(str(base), lora=lora, need_reference=False, seed=0), lr=1e-2)

    def weights(trainer):
        return {n: p.detach().clone() for n, p in trainer.policy.model.named_parameters() if p.requires_grad}

    sampler = TransformersSampler(Policy(str(base), lora=None, need_reference=False), max_new_tokens=4, seed=0)
    return fresh, weights, batches(sampler)


def batches(sampler) -> dict[int, Batch]:
    """Steps 1 and 2: two tasks, four samples each from ``sampler``, with mixed advantages."""
    out = {}
    for step in (1, 2):
        tasks = load_tasks(make_rows(2, seed=step))
        rollouts = [r for group in sampler(tasks, 4) for r in group]
        out[step] = batch_of(rollouts, [1.0, -1.0, 0.5, -0.5] * 2, step)
    return out


def same(a, b) -> bool:
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    import torch

    return torch.equal(a, b) if isinstance(a, torch.Tensor) else a == b


def test_a_step_returns_numeric_metrics_and_moves_the_version_by_one(make):
    fresh, _, batch = make
    trainer = fresh()
    for step in (1, 2):
        metrics = trainer(batch[step])
        assert isinstance(metrics, Mapping) and metrics
        assert all(isinstance(k, str) and isinstance(v, (int, float)) for k, v in metrics.items())
        assert all(math.isfinite(v) for v in metrics.values() if isinstance(v, float))
        assert trainer.version == step


def test_save_then_load_continues_exactly(make, tmp_path):
    fresh, weights, batch = make
    a = fresh()
    a(batch[1])
    a.save(str(tmp_path / "ckpt"))
    a(batch[2])
    b = fresh()
    b.load(str(tmp_path / "ckpt"))
    assert b.version == 1
    b(batch[2])
    assert same(weights(a), weights(b))


def test_a_batch_whose_groups_do_not_align_is_refused(make):
    fresh, _, batch = make
    good = batch[1]
    g = good.groups[0]
    first = g.rollouts[0]
    short = dataclasses.replace(first, advantages=first.advantages[:-1])  # one value short of its tokens
    broken = Batch(1, (Group(g.task, (short, *g.rollouts[1:])), *good.groups[1:]))
    with pytest.raises(RLVRError, match=rf"rollout 0 of row {first.task_id!r}: advantages has \d+ values for \d+"):
        fresh()(broken)
