"""bench/zero_advantage.py times the same trainer reading the rows that carry loss and reading every
row: the two calls it compares do read those rows."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")
pytest.importorskip("peft")

from rlvr.backends.model.policy import LoraSpec, Policy  # noqa: E402
from rlvr.backends.model.tiny import build_tiny_model  # noqa: E402
from rlvr.backends.train.trainer import TorchTrainer  # noqa: E402
from rlvr.testing import batch_of  # noqa: E402
from rlvr.types import Rollout  # noqa: E402
from support.bench_rig import bench_module  # noqa: E402

zero_advantage = bench_module("zero_advantage")


def test_the_timed_calls_read_the_rows_that_carry_loss_then_every_row(tmp_path):
    base = build_tiny_model(tmp_path / "base", hidden=32, layers=2, heads=2, seed=0)
    trainer = TorchTrainer(Policy(str(base), lora=LoraSpec(rank=4, alpha=8.0), need_reference=False), micro_batch=4)
    prompt_ids = tuple(trainer.policy.tokenizer("1+2=")["input_ids"])
    rollouts = [Rollout(str(i), prompt_ids, (5, 6), (0.0, 0.0), "", ()) for i in range(6)]
    batch = batch_of(rollouts, [1.0, -1.0, 0.0, 0.0, 0.0, 0.0])
    seconds, read = zero_advantage.timed(trainer, batch, True)
    assert seconds > 0 and read == 2
    assert zero_advantage.timed(trainer, batch, False)[1] == 6
    assert "_read" not in vars(trainer)  # the trainer is left as it was
