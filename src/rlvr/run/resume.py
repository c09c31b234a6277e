"""Resuming a run folder: what must hold before a run continues, and the record and rows it
continues with.

A run resumes only with the config it started with (``max_steps`` aside) and a corpus that gives
the same split; only from a complete checkpoint that matches its manifest; and never loses a
record row: the record is rewound to the checkpoint, rebuilt from the checkpoint's copy where a
run file lost rows, each repair said once and kept as a warning event
(:mod:`rlvr.record.checkpoints`). The checkpoint's pending rows (admitted, not yet trained) are
admitted again, each with the draw it had. Standard library + pydantic only.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rlvr.config import GRPOConfig
from rlvr.data.tasks import other_split_reason
from rlvr.errors import RecordWarning, RLLoopError
from rlvr.record.checkpoints import Checkpoints
from rlvr.record.run_record import Event, EventKind, RunRecorder, complete_checkpoints, event_of
from rlvr.types import Task


def open_resumable(out_dir: Path | None, config: GRPOConfig,
                   manifest: Mapping[str, Any]) -> tuple[Checkpoints, dict[str, Any]]:
    """The folder's checkpoints and run info, once every refusal has passed: a folder that never
    reached step 0, a changed config, a corpus that splits otherwise, no complete checkpoint."""
    if out_dir is None:
        raise RLLoopError("resume needs out_dir: the run folder to continue")
    if not (out_dir / "run.json").exists() and not complete_checkpoints(out_dir):
        raise RLLoopError(f"{out_dir}: the run never reached step 0 (no run.json), so there is nothing to "
                          "resume; `rlvr train` with the same --out starts it again there")
    found = Checkpoints(out_dir)
    run = found.run_info()
    then, now = dict(run.get("config", {})), config.model_dump(mode="json")
    # A key the record lacks was added to rlvr after the run began: the run had its default.
    defaults = GRPOConfig().model_dump(mode="json")
    changed = sorted(k for k in now.keys() | then.keys()
                     if k != "max_steps" and then.get(k, defaults.get(k)) != now.get(k))
    if changed:
        raise RLLoopError(f"{out_dir}: resume needs the config the run started with; "
                          f"these fields differ: {changed} (only max_steps may change)")
    split = run.get("split", {})
    if (split.get("heldout_hash"), split.get("train_hash")) != (manifest["heldout_hash"], manifest["train_hash"]):
        raise RLLoopError(f"{out_dir}: the corpus does not give the split this run was started with "
                          f"({other_split_reason(split)})")
    if not complete_checkpoints(out_dir):
        raise RLLoopError(f"{out_dir}: no complete checkpoint to resume from; `rlvr train` with the same "
                          "--out starts the run again there")
    return found, run


def reload_record(recorder: RunRecorder, found: Checkpoints, ckpt: Path, state: Mapping[str, Any],
                  run: dict[str, Any]) -> list[Event]:
    """The record up to ``ckpt`` (rebuilt from its copy where a run file lost rows), rewound to it on
    disk, with a warning for every repair; returns the abort events written after it."""
    events, metrics, later = found.rows(ckpt, state["record_offsets"])
    recorder.events, recorder.metrics = [event_of(r) for r in events], metrics
    recorder.run_info = run
    recorder.rewind(state["record_offsets"])
    for note in found.notes:  # said once, and kept in the record
        warnings.warn(note, RecordWarning, stacklevel=3)
        recorder.event(EventKind.WARNING, state["step"], reason=note)
    # Why the run stopped is kept past the rewind: the resumed event carries the last abort's reason.
    return [e for e in map(event_of, later) if e.kind is EventKind.ABORTED]


def pending_rows(state: Mapping[str, Any], train_by_id: Mapping[str, Task], out_dir: Path) -> list[tuple[str, int]]:
    """The checkpoint's pending rows (admitted, not trained) with their draws, to admit again."""
    pending = list(state.get("pending", []))
    unknown = [i for i in pending if i not in train_by_id]
    if unknown:
        raise RLLoopError(f"{out_dir}: the checkpoint's pending rows {unknown[:3]} are not training rows")
    # A checkpoint written before draws were recorded: give each pending row a draw of its own.
    draws = state.get("pending_draws") or [-1 - n for n in range(len(pending))]
    return list(zip(pending, draws, strict=True))
