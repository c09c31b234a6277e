"""The trainer's step with and without ``train.skip_zero_advantage``, on a run's own batches, in one run.

The config runs as ``rlvr train`` would (synchronous, ``--steps`` steps plus one to warm up) and
every batch is kept as it reaches the trainer; that is where the share of rows whose advantage is 0
everywhere comes from (the groups whose samples all scored alike). Then the same trainer trains each
kept batch twice in turn, reading only the rows that carry loss and reading every row, so a load
change on a shared machine hits both alike; it prints the median seconds of a train call each way,
their ratio (the lever's), and the share of rows read.

    python bench/zero_advantage.py [--config examples/addition.toml] [--steps 30] [--threads N]
"""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from rlvr.wiring.seams import make_loop
from step_time import synchronous_run


class KeepingTrainer:
    """The run's trainer, keeping each batch it trains."""

    def __init__(self, inner: Any):
        self.inner, self.batches = inner, []

    def __call__(self, batch: Any) -> Any:
        self.batches.append(batch)
        return self.inner(batch)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def timed(trainer: Any, batch: Any, skip: bool) -> tuple[float, int]:
    """Seconds of one train call and the rows its forward-backward read."""
    read = trainer._read
    counted: list[int] = []
    trainer.skip_zero_advantage = skip
    trainer._read = lambda rollouts: counted.append(len(rows := read(rollouts))) or rows
    try:
        start = time.perf_counter()
        trainer(batch)
        return time.perf_counter() - start, sum(counted)
    finally:
        del trainer._read


def main() -> None:
    cfg, _ = synchronous_run(__doc__, 30, "batches to time")
    with tempfile.TemporaryDirectory(prefix="zero_advantage_") as tmp:
        loop = make_loop(cfg, Path(tmp) / "run", log=lambda m: print("  " + m, flush=True))
        trainer = loop.trainer
        loop.trainer = keep = KeepingTrainer(trainer)
        loop.run()
    on, off, read, rows = [], [], 0, 0
    for batch in keep.batches[1:]:
        seconds, n_read = timed(trainer, batch, True)
        on.append(seconds)
        off.append(timed(trainer, batch, False)[0])
        read, rows = read + n_read, rows + len(batch.rollouts)
    skip_s, read_s = statistics.median(on), statistics.median(off)
    print(f"\n{cfg.loop.tasks_per_step} rows x {cfg.loop.group_k} a step, {len(on)} batches of the run "
          f"(policy_loss {cfg.train.policy_loss}, kl_coef {cfg.loop.kl_coef}, entropy_coef {cfg.train.entropy_coef})")
    print(f"rows read: {read} of {rows} ({read / rows:.0%}); the rest had advantage 0 everywhere")
    print(f"train call, median: every row read {read_s * 1000:.0f} ms, rows of advantage 0 skipped "
          f"{skip_s * 1000:.0f} ms; ratio {skip_s / read_s:.2f}")


if __name__ == "__main__":
    main()
