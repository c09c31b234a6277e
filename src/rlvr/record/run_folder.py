"""The run folder before its first checkpoint: whether ``rlvr train`` may use it, and what a failed start leaves.

A run folder holds a *run* once it has a complete checkpoint: from then on only ``rlvr resume``
continues it, and ``rlvr train`` refuses it. Before that it holds an *unfinished start*: a config
saved, a base being built, maybe a run.json and the events of a step 0 that failed (whose traceback
is in events.jsonl). Nothing there can be resumed, so ``rlvr train`` with the same ``--out`` clears it
and starts again: a failed start never strands the folder. A start that fails before run.json is
written leaves nothing at all: what it created is removed (:func:`first_start`).

Invariants: a folder with a complete checkpoint, or with checkpoints a resume set aside as damaged,
is never cleared; a folder rlvr did not write (no config.json, no run.json) is never cleared, only
refused; a file is never taken for a folder.
Part of the composition root; standard library only.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from rlvr.errors import UsageError
from rlvr.record.checkpoints import CORRUPT_SUFFIX
from rlvr.record.run_record import complete_checkpoints

CONFIG_FILE = "config.json"
RUN_FILE = "run.json"


def refuse_a_file(run_dir: Path) -> None:
    if run_dir.exists() and not run_dir.is_dir():
        raise UsageError(f"--out {run_dir} is a file, not a folder; pick a folder for the run record")


def set_aside(run_dir: Path) -> list[Path]:
    """Checkpoints a resume found damaged and set aside (``step_N.corrupt``): the run had completed them."""
    return sorted((run_dir / "checkpoints").glob(f"step_*{CORRUPT_SUFFIX}*"))


def unfinished_start(run_dir: Path) -> bool:
    """Whether ``run_dir`` holds what rlvr wrote for a run that never completed a checkpoint."""
    written = (run_dir / CONFIG_FILE).exists() or (run_dir / RUN_FILE).exists()
    return run_dir.is_dir() and written and not complete_checkpoints(run_dir) and not set_aside(run_dir)


def check_fresh_run_dir(run_dir: Path) -> None:
    """``rlvr train`` may use ``run_dir``: new, empty, or an unfinished start (see the module doc); never a
    folder holding a run (``rlvr resume`` continues those) or anything rlvr did not write."""
    refuse_a_file(run_dir)
    if run_dir.is_dir() and complete_checkpoints(run_dir):
        raise UsageError(f"{run_dir} already holds a run; use `rlvr resume {run_dir}` or pick another --out")
    if run_dir.is_dir() and set_aside(run_dir):
        raise UsageError(f"{run_dir} holds a run whose checkpoints were all found damaged and set aside "
                         f"({', '.join(p.name for p in set_aside(run_dir))}); inspect them, or pick another --out")
    if run_dir.is_dir() and any(run_dir.iterdir()) and not unfinished_start(run_dir):
        raise UsageError(f"{run_dir} is not empty and holds no run; pick an empty or new folder for --out")


def clear_unfinished_start(run_dir: Path, log: Callable[[str], None] = print) -> None:
    """Empty ``run_dir`` when it holds an unfinished start, so a new start begins from nothing."""
    if not unfinished_start(run_dir):
        return
    log(f"{run_dir}: a start that never reached its first checkpoint is here; starting over in it")
    for entry in run_dir.iterdir():
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        else:
            entry.unlink()


def prepare_run_dir(run_dir: Path) -> None:
    """Create ``run_dir`` (or accept it as it is), or say in one line why it cannot be used."""
    refuse_a_file(run_dir)
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        probe = run_dir / ".rlvr-write-test"
        probe.write_text("")
        probe.unlink()
    except OSError as exc:
        raise UsageError(f"--out {run_dir} cannot be written ({exc.strerror or exc}); pick another folder") from None


@contextmanager
def first_start(run_dir: Path) -> Iterator[None]:
    """A fresh start in ``run_dir``: when the block fails before run.json is written, what it created is
    removed (the folder too, if it made it); after that, what it wrote stays, as an unfinished start
    (or a run, once checkpointed)."""
    existed = run_dir.exists()
    before = set(run_dir.iterdir()) if existed else set()
    try:
        yield
    except BaseException:
        if not (run_dir / RUN_FILE).exists():
            _remove_new(run_dir, existed, before)
        raise


def _remove_new(run_dir: Path, existed: bool, before: set[Path]) -> None:
    if not existed:
        shutil.rmtree(run_dir, ignore_errors=True)
        return
    for entry in set(run_dir.iterdir()) - before:
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry, ignore_errors=True)
        else:
            entry.unlink(missing_ok=True)
