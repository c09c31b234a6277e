"""Checkpoints a resume can trust: a manifest of content hashes written last, checked before loading,
and the run record's own copy in every checkpoint, from which a damaged record is rebuilt.

A checkpoint folder (``checkpoints/step_N/``)::

    trainer/          what the trainer's save() wrote (any files)
    record/           run.json, events.jsonl, metrics.jsonl exactly as of this checkpoint
    loop_state.json   the loop's state (record_offsets: how many events and metrics rows are the run's)
    manifest.json     {"format": 1, "files": {path: {"sha256", "bytes"}}}, written last

Invariants:
- A checkpoint folder gets its final name only once its manifest is written (it is built under a
  temporary name), so a complete folder without a manifest was written before manifests existed, or
  lost its manifest since. Which of the two is told by the run: one whose run.json records
  ``checkpoint_format`` (every run begun since manifests) writes one with every checkpoint, and once
  a checkpoint has one, every later step of that run has one too. Where either says a manifest was
  written, a checkpoint without one is damaged (:func:`checkpoint_fault`).
- Resume never loads a checkpoint whose files differ from its manifest (flipped bytes, a truncated
  file, a file gone) or whose manifest or loop state cannot be read: it moves the folder aside
  (``step_N.corrupt``, kept for inspection), says so, and takes the newest one that checks out. A
  checkpoint of a run from before manifests is loaded unchecked; if that load fails, it is set aside
  the same way.
  A checkpoint that checks out but does not load is a real error (another model, another config)
  and is raised, never skipped.
- ``events.jsonl`` and ``metrics.jsonl`` never lose rows on resume: the rows up to the checkpoint
  are the checkpoint's copy, and a run file that lost or changed any of them is rebuilt from it,
  with a note. A checkpoint without a copy (older runs) whose run files hold fewer rows than it
  recorded is refused with the reason.
Standard library only.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlvr.errors import RecordError, RLVRError, exception_text
from rlvr.record.run_record import STATE_FILE, complete_checkpoints, write_json_atomic
from rlvr.seeding import file_sha256

MANIFEST = "manifest.json"
RECORD_DIR = "record"  # the run record's copy, inside a checkpoint
RECORD_FILES = ("run.json", "events.jsonl", "metrics.jsonl")
CORRUPT_SUFFIX = ".corrupt"
FORMAT = 1


def _files(folder: Path) -> Iterator[Path]:
    for path in sorted(folder.rglob("*")):
        if path.is_file() and path.relative_to(folder).as_posix() != MANIFEST:
            yield path


def write_manifest(folder: Path) -> None:
    """Hash every file under ``folder`` into ``manifest.json`` (written atomically, last)."""
    files = {p.relative_to(folder).as_posix(): {"sha256": file_sha256(p), "bytes": p.stat().st_size}
             for p in _files(folder)}
    write_json_atomic(folder / MANIFEST, {"format": FORMAT, "files": files})


def has_manifest(folder: Path) -> bool:
    return (folder / MANIFEST).exists()


def manifest_fault(folder: Path) -> str | None:
    """Why ``folder`` does not match its manifest (``None``: it matches, or it has none)."""
    path = folder / MANIFEST
    if not path.exists():
        return None
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
        files = manifest["files"]
        assert isinstance(files, dict)
    except (OSError, ValueError, KeyError, TypeError, AssertionError):
        return f"its {MANIFEST} cannot be read"
    for name, want in sorted(files.items()):
        file = folder / name
        if not file.is_file():
            return f"{name} is missing"
        if file.stat().st_size != want.get("bytes"):
            return f"{name} is {file.stat().st_size} bytes, {want.get('bytes')} when written"
        if file_sha256(file) != want.get("sha256"):
            return f"{name} changed since it was written (sha256 differs)"
    return None


def manifest_expected(folder: Path) -> bool:
    """Whether checkpoint ``folder`` (``RUN/checkpoints/step_N``) was written with a manifest: its run's
    record says it writes them, or a checkpoint of an earlier step (sound or set aside) has one."""
    run_dir = folder.parent.parent
    try:
        run = json.loads((run_dir / "run.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        run = None  # a damaged record: the sibling checkpoints still tell
    if isinstance(run, dict) and "checkpoint_format" in run:
        return True
    step = _step(folder.name)
    return step is not None and any(
        has_manifest(other) for other in folder.parent.glob("step_*")
        if (s := _step(other.name)) is not None and s < step)


def _step(name: str) -> int | None:
    """The step of ``step_N``, ``step_N.corrupt``, ``step_N.corrupt2``; ``None`` for any other name."""
    digits = name.removeprefix("step_").split(".")[0]
    return int(digits) if name.startswith("step_") and digits.isdigit() else None


def checkpoint_fault(folder: Path) -> str | None:
    """Why checkpoint ``folder`` cannot be trusted (``None``: it matches its manifest, or it is from a
    run written before manifests and has none)."""
    if not has_manifest(folder):
        if manifest_expected(folder):
            return f"its {MANIFEST} is missing, and this run writes one with every checkpoint"
        return None
    return manifest_fault(folder)


def require_sound(folder: Path) -> None:
    """Refuse to read a checkpoint whose files differ from its manifest (or that lost it), naming the file."""
    fault = checkpoint_fault(folder)
    if fault is not None:
        raise RecordError(f"checkpoint {folder.name} is damaged ({fault}); choose another step with --step, "
                          "or `rlvr resume` the run, which sets damaged checkpoints aside")


def set_aside(folder: Path) -> Path:
    """Rename a bad checkpoint ``step_N`` to ``step_N.corrupt`` (``.corrupt2``... if taken)."""
    target, n = folder.with_name(folder.name + CORRUPT_SUFFIX), 1
    while target.exists():
        n += 1
        target = folder.with_name(f"{folder.name}{CORRUPT_SUFFIX}{n}")
    folder.rename(target)
    return target


@dataclass
class Checkpoints:
    """A run folder's checkpoints, checked newest first; ``notes`` says what was set aside or rebuilt."""

    run_dir: Path
    notes: list[str] = field(default_factory=list)

    def _sound(self) -> Path | None:
        """The newest complete checkpoint that matches its manifest (or has none, in a run from before
        manifests); bad ones set aside."""
        for ckpt in reversed(complete_checkpoints(self.run_dir)):
            fault = checkpoint_fault(ckpt)
            if fault is None:
                return ckpt
            self._reject(ckpt, fault)
        return None

    def _reject(self, ckpt: Path, fault: str) -> None:
        moved = set_aside(ckpt)
        self.notes.append(f"checkpoint {ckpt.name} is damaged ({fault}); set aside as {moved.name} (delete it "
                          "once inspected)")

    def run_info(self, repair: bool = True) -> dict[str, Any]:
        """``run.json``, or, when it cannot be read, the newest sound checkpoint's copy of it (written
        back as ``run.json``, and said in :attr:`notes`, unless ``repair`` is off: a look that changes
        nothing, so the resume that follows repairs it and says so)."""
        path = self.run_dir / "run.json"
        try:
            return _json_object(path)
        except RecordError as damaged:
            ckpt = self._sound()
            copy = ckpt / RECORD_DIR / "run.json" if ckpt is not None else None
            if copy is None or not copy.exists():
                raise damaged from None
            run = _json_object(copy)
            if not repair:
                return run
            write_json_atomic(path, run)
            self.notes.append(f"{damaged}; rebuilt from {ckpt.name}'s copy")  # type: ignore[union-attr]
            return run

    def open(self, load: Callable[[Path, dict[str, Any]], None]) -> tuple[Path, dict[str, Any]]:
        """The newest checkpoint that checks out and loads: ``(folder, loop state)``. ``load(folder,
        state)`` restores the trainer from it."""
        while True:
            ckpt = self._sound()
            if ckpt is None:
                why = "; ".join(self.notes) or "there is none"
                raise RecordError(f"{self.run_dir}: no usable checkpoint to resume from ({why})")
            checked = has_manifest(ckpt)
            try:
                state = _json_object(ckpt / STATE_FILE)
                load(ckpt, state)
            except RLVRError:
                raise  # refused on purpose (another model, a trainer without load): not damage
            except Exception as exc:
                if checked:  # the bytes are the ones written: the failure is real, not damage
                    raise
                self._reject(ckpt, f"it does not load: {exception_text(exc)}")
                continue
            return ckpt, state

    def rows(self, ckpt: Path, offsets: dict[str, int]) -> tuple[list[dict[str, Any]], list[dict[str, Any]],
                                                                 list[dict[str, Any]]]:
        """``(events, metrics, later events)``: the run's rows up to the checkpoint, each file checked
        against the checkpoint's copy and rebuilt from it where it lost or changed a row; and the
        events written after the checkpoint (an abort's reason), when the file is whole."""
        out = []
        later: list[dict[str, Any]] = []
        for name in ("events.jsonl", "metrics.jsonl"):
            want = offsets[name.split(".")[0]]
            disk, fault = read_rows(self.run_dir / name)
            copy_path = ckpt / RECORD_DIR / name
            if not copy_path.exists():  # a checkpoint from before copies: the run file must hold its rows
                if fault is not None or len(disk) < want:
                    raise RecordError(f"{self.run_dir / name}: {fault or f'{len(disk)} rows'}, but checkpoint "
                                      f"{ckpt.name} recorded {want} and keeps no copy: the rows are lost; restore "
                                      "the file from a backup to resume")
                rows = disk[:want]
            else:
                rows, _ = read_rows(copy_path)
                if len(rows) != want:
                    raise RecordError(f"{copy_path}: {len(rows)} rows, the checkpoint recorded {want}")
                if disk[:want] != rows:
                    what = fault or ("missing" if not (self.run_dir / name).exists() else
                                     f"{min(len(disk), want)} of {want} rows" if len(disk) < want else
                                     "rows differ")
                    self.notes.append(f"{name} did not hold the {want} rows recorded at {ckpt.name} ({what}); "
                                      "rebuilt from the checkpoint's copy")
                    disk = rows
            if name == "events.jsonl" and disk[:want] == rows:
                later = disk[want:]
            out.append(rows)
        return out[0], out[1], later


def recorded_split(run_dir: Path) -> dict[str, Any] | None:
    """The split manifest ``run.json`` records (a resumed run carves its corpus by the rule it names);
    ``None`` when there is no readable record: the resume itself then says what is wrong."""
    try:
        split = Checkpoints(run_dir).run_info(repair=False).get("split")
    except (RLVRError, OSError):
        return None
    return split if isinstance(split, dict) else None


def _json_object(path: Path) -> dict[str, Any]:
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise RecordError(f"{path} is missing") from None
    except (OSError, ValueError) as exc:
        raise RecordError(f"{path} cannot be read ({exception_text(exc)})") from None
    if not isinstance(value, dict):
        raise RecordError(f"{path} does not hold a JSON object")
    return value


def read_rows(path: Path) -> tuple[list[dict[str, Any]], str | None]:
    """The JSON lines of ``path`` up to the first that does not parse, and why reading stopped there
    (``None``: the whole file, a torn last line aside, was read)."""
    if not path.exists():
        return [], "missing"
    try:
        lines = path.read_bytes().split(b"\n")
    except OSError as exc:
        return [], f"unreadable ({exc.strerror or exc})"
    rows: list[dict[str, Any]] = []
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError:
            return rows, None if i == len(lines) else f"line {i} is not a JSON line"
        if not isinstance(row, dict):
            return rows, f"line {i} is not a JSON object"
        rows.append(row)
    return rows, None
