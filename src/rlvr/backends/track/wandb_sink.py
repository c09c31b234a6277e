"""A W&B run under ``DIR/wandb``: the config, ``run.log`` of every step's scalars at that step, sample
completions as a ``wandb.Table`` at their step. A resumed run continues the same W&B run id, so its
sessions join one run.

``mode`` is W&B's: ``offline`` (the default: nothing leaves the machine until
``wandb sync DIR/wandb/offline-run-*``), ``online`` (streamed to the W&B server as the run goes,
``entity`` the team or user it lands under; the login is W&B's own, ``WANDB_API_KEY`` or
``wandb login``) or ``disabled`` (every call a no-op, nothing written). Imports wandb."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, get_args

import wandb

from rlvr.backends.track.common import SAMPLE_COLUMNS

WandbMode = Literal["offline", "online", "disabled"]
WANDB_MODES: tuple[WandbMode, ...] = get_args(WandbMode)


def _earlier_run_id(folder: Path) -> str | None:
    """The id of this run folder's latest earlier W&B session (``offline-run-<time>-<id>`` or
    ``run-<time>-<id>``, online and offline sessions alike), if any."""
    runs = [p.name for p in folder.glob("*run-*-*") if p.name.startswith(("offline-run-", "run-"))]
    runs.sort(key=lambda name: name.removeprefix("offline-"))  # by the time in the name
    return runs[-1].rsplit("-", 1)[-1] if runs else None


class WandbSink:
    name = "wandb"

    def __init__(self, run_dir: Path, project: str, run_name: str, *, mode: str = "offline",
                 entity: str | None = None):
        known = next((m for m in WANDB_MODES if m == mode), None)
        if known is None:
            raise ValueError(f"log.wandb_mode={mode!r}: one of {list(WANDB_MODES)}")
        (run_dir / "wandb").mkdir(parents=True, exist_ok=True)
        run_id = _earlier_run_id(run_dir / "wandb")
        self.mode = mode
        # Console capture off: rlvr's own progress display owns the terminal.
        settings = wandb.Settings(console="off", save_code=False, disable_git=True, silent=True)
        self.run = wandb.init(mode=known, dir=str(run_dir), project=project, entity=entity, name=run_name, id=run_id,
                              resume="allow" if run_id else None, settings=settings, reinit="create_new")

    def log_config(self, config: Mapping[str, Any]) -> None:
        self.run.config.update(dict(config), allow_val_change=True)

    def log_metrics(self, step: int, scalars: Mapping[str, float]) -> None:
        self.run.log(dict(scalars), step=step)

    def log_samples(self, step: int, rows: Sequence[Mapping[str, Any]]) -> None:
        table = wandb.Table(columns=list(SAMPLE_COLUMNS), data=[[r.get(c) for c in SAMPLE_COLUMNS] for r in rows])
        self.run.log({"samples": table}, step=step)

    def close(self) -> None:
        self.run.finish()
        # finish() can return before W&B's service has written the log out; teardown waits for it,
        # so the run's files are complete once close() returns (as the record's files are).
        wandb.teardown()

    def describe(self) -> dict[str, Any]:
        return {"type": "wandb", "dir": "wandb", "mode": self.mode, "run_id": self.run.id}
