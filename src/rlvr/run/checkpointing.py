"""A run's checkpoints as the loop writes them: one folder per checkpointed step, written whole or
not at all, pruned to the newest ``keep_last`` plus the selected one, and ``selected.json`` naming
only a checkpoint that is on disk.

A checkpoint folder is written under a ``.tmp`` name and renamed once complete: the trainer's
files, the loop state (whose record offsets include the checkpoint's own event), a copy of the
record to rebuild a damaged one from, and last the manifest a resume trusts
(:mod:`rlvr.record.checkpoints`). A checkpoint that fails to write gives its space back and the
last complete one stays the one to resume from. Standard library only.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from rlvr.errors import RecordError, RLLoopError
from rlvr.protocols import Checkpointable
from rlvr.record.checkpoints import RECORD_DIR, write_manifest
from rlvr.record.run_record import (
    STATE_FILE,
    TRAINER_DIR,
    EventKind,
    RunRecorder,
    checkpoint_name,
    complete_checkpoints,
    disk_errors,
    write_json_atomic,
)
from rlvr.run.gate import HeldoutGate

SELECTION_RULE = "best held-out score; ties keep the earliest step; pool score never used"


def write_checkpoint(out_dir: Path, step: int, parent: int | None, trainer: Any, recorder: RunRecorder,
                     state: Callable[[], dict[str, Any]]) -> str:
    """Checkpoint ``step`` into ``out_dir`` (its ``checkpoint`` event recorded on the way, ``state()``
    read after it); the folder's name."""
    final = out_dir / checkpoint_name(step)
    tmp = final.with_name(final.name + ".tmp")
    resume_from = "no complete checkpoint yet" if parent is None else f"the last complete one is step {parent}"
    try:
        with disk_errors(f"checkpoint {checkpoint_name(step)}",
                         f"{resume_from}: free space, then `rlvr resume` continues from it"):
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir(parents=True)
            if isinstance(trainer, Checkpointable):
                trainer.save(str(tmp / TRAINER_DIR))
            # Recorded before the state is written, so the state's record offsets include it.
            recorder.event(EventKind.CHECKPOINT, step, parent=parent, path=checkpoint_name(step))
            write_json_atomic(tmp / STATE_FILE, state())
            recorder.write_copy(tmp / RECORD_DIR)  # what a damaged record is rebuilt from
            write_manifest(tmp)  # last: a resume trusts only files that match it
    except RecordError:
        shutil.rmtree(tmp, ignore_errors=True)  # give back what the half-written checkpoint took
        raise
    shutil.rmtree(final, ignore_errors=True)
    tmp.rename(final)
    return checkpoint_name(step)


def prune(out_dir: Path, keep_last: int, selected: int | None) -> None:
    """Remove complete checkpoints but the newest ``keep_last`` and the ``selected`` step's."""
    done = complete_checkpoints(out_dir)
    keep = set(done[-keep_last:])
    if selected is not None:
        keep.add(out_dir / checkpoint_name(selected))
    for p in done:
        if p not in keep:
            shutil.rmtree(p)


def load_trainer(trainer: Any, ckpt: Path, state: Mapping[str, Any]) -> None:
    """The trainer's weights from ``ckpt`` (a trainer without save/load resumes only from step 0)."""
    if isinstance(trainer, Checkpointable):
        trainer.load(str(ckpt / TRAINER_DIR))
    elif state["step"] > 0:
        raise RLLoopError("the trainer has no save()/load(): its weights cannot be resumed")


def selected(gate: HeldoutGate, pool_scores: Mapping[int, float], in_folder: bool) -> dict[str, Any]:
    """``selected.json``: the gate's best step, its scores and checkpoint (``in_folder``: the run
    writes checkpoints), and the rule that picked it."""
    best = gate.best_step
    assert best is not None
    return {"step": best, "heldout_score": gate.best_score, "baseline_heldout_score": gate.scores.get(0),
            "checkpoint": checkpoint_name(best) if in_folder else None,
            "pool_score": pool_scores.get(best), "heldout_scores": gate.scores, "rule": SELECTION_RULE}
