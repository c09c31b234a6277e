"""TensorBoard event files under ``DIR/tensorboard`` through ``torch.utils.tensorboard``: every
scalar per step, the config as a text table at step 0, sample completions as a text table at their
step. Events are flushed after each call, so a killed run keeps every step it logged. A session's
writer opens at the first step it logs with ``purge_step`` there, so after a resume TensorBoard
hides what the earlier session logged from that step on (the steps the resume redoes).
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
        probe = log_dir / ".rlvr-write-test"
        probe.write_text("")  # an unwritable folder fails here, at start, not at the first step
        probe.unlink()
        self.log_dir = log_dir
        self.writer: SummaryWriter | None = None
        self.config_text: str | None = None

    def _writer(self, step: int) -> SummaryWriter:
        if self.writer is None:
            self.writer = SummaryWriter(log_dir=str(self.log_dir), flush_secs=30, purge_step=step)
            if self.config_text is not None:
                self.writer.add_text("config", self.config_text, global_step=step)
        return self.writer

    def log_config(self, config: Mapping[str, Any]) -> None:
        self.config_text = config_markdown(config)  # written with the session's first step

    def log_metrics(self, step: int, scalars: Mapping[str, float]) -> None:
        writer = self._writer(step)
        for key, value in scalars.items():
            writer.add_scalar(key, value, global_step=step)
        writer.flush()

    def log_samples(self, step: int, rows: Sequence[Mapping[str, Any]]) -> None:
        writer = self._writer(step)
        writer.add_text("samples", markdown_table(rows), global_step=step)
        writer.flush()

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()

    def describe(self) -> dict[str, Any]:
        return {"type": "tensorboard", "dir": "tensorboard"}
