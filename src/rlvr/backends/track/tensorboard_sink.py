"""TensorBoard event files under ``DIR/tensorboard`` through ``torch.utils.tensorboard``: every
scalar per step, the config as a text table at step 0, sample completions as a text table at their
step. Events are flushed after each call, so a killed run keeps every step it logged; TensorBoard's
own reader drops the steps a resumed run redoes (it purges events past a step seen again).
Open with ``tensorboard --logdir DIR/tensorboard``. Imports torch and tensorboard."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from torch.utils.tensorboard import SummaryWriter

from rlvr.backends.track.common import config_markdown, markdown_table


class TensorBoardSink:
    name = "tensorboard"

    def __init__(self, log_dir: Path):
        log_dir.mkdir(parents=True, exist_ok=True)
        self.log_dir = log_dir
        self.writer = SummaryWriter(log_dir=str(log_dir), flush_secs=30)

    def log_config(self, config: Mapping[str, Any]) -> None:
        self.writer.add_text("config", config_markdown(config), global_step=0)
        self.writer.flush()

    def log_metrics(self, step: int, scalars: Mapping[str, float]) -> None:
        for key, value in scalars.items():
            self.writer.add_scalar(key, value, global_step=step)
        self.writer.flush()

    def log_samples(self, step: int, rows: Sequence[Mapping[str, Any]]) -> None:
        self.writer.add_text("samples", markdown_table(rows), global_step=step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()

    def describe(self) -> dict[str, Any]:
        return {"type": "tensorboard", "dir": "tensorboard"}
