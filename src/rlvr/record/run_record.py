"""The run record: one folder per run, written as the run goes, read back into typed objects.

Layout::

    run.json        resolved config + sha256, versions, seed, split manifest, backends
    events.jsonl    append-only typed events (start, step, heldout, checkpoint, selected, ...)
    metrics.jsonl   one flat object of scalars per step
    samples/        step_N.jsonl: a few groups' completions every ``log_samples_every`` steps
    checkpoints/    step_N/ with loop_state.json (+ trainer state, the record's copy and a manifest of
                    content hashes: rlvr.record.checkpoints); each names its parent
    selected.json   the published checkpoint and the evidence

Invariants: JSON files are replaced atomically (temp file, fsync, rename); JSONL lines are
appended and flushed one at a time, so a process that dies (an error, a kill, the OOM killer) leaves
every complete line readable: each is in the operating system's hands when the call returns. They
are fsynced at every event but a step's (a checkpoint, a held-out score, a selection, the end) and
at close, not per step: a step's lines would cost the step two disk flushes (a fraction of a
millisecond each on a quiet local disk, tens of milliseconds on a busy or network one), and what a
machine losing power can take (the steps since the last such event) is what resume redoes from the
last checkpoint anyway. The only
non-deterministic values are wall-clock ones, kept under keys that :func:`strip_timing` removes.
Without an ``out_dir`` the same recorder keeps everything in memory. Metric sinks
(:mod:`rlvr.record.sinks`) are fed here, from the same values at the same moment as the files, so a
tracker and the record cannot disagree. Standard library only.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

from rlvr.errors import RecordError
from rlvr.record.sinks import SampleSchedule, SinkFanout, heldout_scalars, sample_rows

SAMPLES_DIR = "samples"
TIMING_KEYS = frozenset({"time", "created_at", "elapsed_s"})
TIMING_PREFIXES = ("perf/", "mem/", "time/")


class EventKind(StrEnum):
    START = "start"
    RESUMED = "resumed"
    STEP = "step"
    HELDOUT = "heldout"
    CHECKPOINT = "checkpoint"
    SELECTED = "selected"
    WARNING = "warning"
    ABORTED = "aborted"
    FAILED = "failed"  # an error ended the run: its message and full traceback
    FINISHED = "finished"


@dataclass(frozen=True, slots=True)
class Event:
    kind: EventKind
    step: int
    data: dict[str, Any] = field(default_factory=dict)
    time: float | None = None


def jsonable(obj: Any) -> Any:
    """JSON-safe copy: non-finite floats become None (JSON has no NaN), tuples become lists."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {str(k): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [jsonable(v) for v in obj]
    return obj


def dumps(obj: Any) -> str:
    return json.dumps(jsonable(obj), sort_keys=True, allow_nan=False, ensure_ascii=False)


def write_json_atomic(path: Path, obj: Any) -> None:
    """Replace ``path`` with ``obj`` as JSON so readers see the old or the new file, never half."""
    _write_atomic(path, json.dumps(jsonable(obj), sort_keys=True, indent=2, allow_nan=False) + "\n")


def write_jsonl_atomic(path: Path, rows: list[Any]) -> None:
    """Replace ``path`` with ``rows`` as JSON lines, whole or not at all."""
    _write_atomic(path, "".join(dumps(r) + "\n" for r in rows))


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)  # a failed write (a full disk) leaves the old file and no debris
        raise
    fsync_dir(path.parent)


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def strip_timing(obj: Any) -> Any:
    """``obj`` without wall-clock values (for comparing two runs of the same seed)."""
    if isinstance(obj, dict):
        return {k: strip_timing(v) for k, v in obj.items()
                if k not in TIMING_KEYS and not k.startswith(TIMING_PREFIXES)}
    if isinstance(obj, list):
        return [strip_timing(v) for v in obj]
    return obj


@contextlib.contextmanager
def disk_errors(what: str, hint: str = "") -> Iterator[None]:
    """Turn an ``OSError`` (a full disk, a read-only folder) while writing ``what`` into a
    :class:`RecordError` that says what and why; the record already on disk stays readable."""
    try:
        yield
    except OSError as exc:
        raise RecordError(f"writing {what} failed: {exc.strerror or exc}" + (f"; {hint}" if hint else "")) from exc


class RunRecorder:
    """Appends events and metrics; mirrors them to ``out_dir`` when one is given."""

    def __init__(self, out_dir: str | os.PathLike[str] | None, clock: Callable[[], float],
                 sinks: SinkFanout | None = None, samples: SampleSchedule = SampleSchedule()):
        self.out_dir = Path(out_dir) if out_dir is not None else None
        self.clock = clock
        self.sinks = sinks if sinks is not None else SinkFanout()
        self._last_step = 0
        self.sinks.on_failure = lambda name, reason: self.event(EventKind.WARNING, self._last_step,
                                                                 sink=name, reason=reason)
        self.schedule = samples
        self.events: list[Event] = []
        self.metrics: list[dict[str, Any]] = []
        self.samples: dict[int, list[dict[str, Any]]] = {}
        self.run_info: dict[str, Any] = {}
        self.selected: dict[str, Any] | None = None
        self._unsynced: set[str] = set()  # JSONL files with lines written since the last fsync
        if self.out_dir is not None:
            self.out_dir.mkdir(parents=True, exist_ok=True)

    def _append(self, name: str, obj: Any) -> None:
        if self.out_dir is None:
            return
        with disk_errors(f"{self.out_dir / name}", "every complete line before it is kept"), \
                open(self.out_dir / name, "a", encoding="utf-8") as f:
            f.write(dumps(obj) + "\n")
            f.flush()
        self._unsynced.add(name)

    def sync(self) -> None:
        """The JSON lines written so far, on disk (fsync: see the module doc for when it runs)."""
        if self.out_dir is None:
            return
        for name in sorted(self._unsynced):
            with disk_errors(f"{self.out_dir / name}", "every complete line before it is kept"), \
                    open(self.out_dir / name, "a", encoding="utf-8") as f:
                os.fsync(f.fileno())
            self._unsynced.discard(name)

    def write_run_info(self, info: dict[str, Any]) -> None:
        self.run_info = jsonable(info)
        if self.out_dir is not None:
            with disk_errors(f"{self.out_dir / 'run.json'}"):
                write_json_atomic(self.out_dir / "run.json", self.run_info)
        self.sinks.log_config(self.run_info)

    def event(self, kind: EventKind, step: int, **data: Any) -> Event:
        ev = Event(kind, step, jsonable(data), self.clock())
        self.events.append(ev)
        self._last_step = step
        self._append("events.jsonl", {"kind": str(kind), "step": step, "time": ev.time, **ev.data})
        if kind is not EventKind.STEP:
            self.sync()
        if kind is EventKind.HELDOUT:
            self.sinks.log_metrics(step, heldout_scalars(ev.data["score"], ev.data.get("by_env"),
                                                         ev.data.get("train_score")))
        return ev

    def metric(self, step: int, scalars: dict[str, Any]) -> None:
        row = jsonable({"step": step, **scalars})
        self.metrics.append(row)
        self._last_step = step
        self._append("metrics.jsonl", row)
        self.sinks.log_metrics(step, row)

    def sample(self, step: int, groups: Any) -> None:
        """Keep a few of the step's groups (when the schedule says so) in ``samples/step_N.jsonl``,
        written whole (temp file, fsync, rename), and hand the same rows to the sinks."""
        if not self.schedule.due(step):
            return
        rows = jsonable(sample_rows(step, groups, self.schedule.groups))
        self.samples[step] = rows
        if self.out_dir is not None:
            folder = self.out_dir / SAMPLES_DIR
            with disk_errors(f"{folder / sample_file(step)}", "the samples of earlier steps are kept"):
                folder.mkdir(exist_ok=True)
                write_jsonl_atomic(folder / sample_file(step), rows)
        self.sinks.log_samples(step, rows)

    def close(self) -> None:
        """The end of this session: its lines on disk, and the sinks flushed and closed."""
        try:
            self.sync()
        finally:
            self.sinks.close()

    def write_selected(self, payload: dict[str, Any]) -> None:
        self.selected = jsonable(payload)
        if self.out_dir is not None:
            with disk_errors(f"{self.out_dir / 'selected.json'}", "the previous selection stays on disk"):
                write_json_atomic(self.out_dir / "selected.json", self.selected)

    def offsets(self) -> dict[str, int]:
        """How many events and metric rows exist now (stored in each checkpoint)."""
        return {"events": len(self.events), "metrics": len(self.metrics)}

    def write_copy(self, folder: Path) -> None:
        """The record as it stands (``run.json``, ``events.jsonl``, ``metrics.jsonl``) into ``folder``:
        a checkpoint's own copy, from which a resume rebuilds damaged run files."""
        folder.mkdir(parents=True, exist_ok=True)
        write_json_atomic(folder / "run.json", self.run_info)
        write_jsonl_atomic(folder / "events.jsonl", [_event_row(e) for e in self.events])
        write_jsonl_atomic(folder / "metrics.jsonl", self.metrics)

    def rewind(self, offsets: dict[str, int]) -> None:
        """Forget everything recorded after a checkpoint (resume redoes those steps)."""
        self.events = self.events[: offsets["events"]]
        self.metrics = self.metrics[: offsets["metrics"]]
        last = max((e.step for e in self.events), default=0)
        if self.out_dir is None:
            self.samples = {s: rows for s, rows in self.samples.items() if s <= last}
            return
        self.samples = {}
        for step, file in _sample_files(self.out_dir):
            if step > last:
                file.unlink()  # that step is redone, and its samples written again
                continue
            try:
                self.samples[step] = _read_jsonl(file)
            except (RecordError, OSError):
                pass  # a damaged log of samples stays on disk as it is; the run does not depend on it
        for name, rows in (("events.jsonl", [_event_row(e) for e in self.events]),
                           ("metrics.jsonl", self.metrics)):
            with disk_errors(f"{self.out_dir / name}", "the file on disk is unchanged: free space and resume again"):
                write_jsonl_atomic(self.out_dir / name, rows)

    def record(self) -> RunRecord:
        return RunRecord(self.out_dir, dict(self.run_info), list(self.events), list(self.metrics),
                         self.selected, dict(self.samples))


def _event_row(e: Event) -> dict[str, Any]:
    return {"kind": str(e.kind), "step": e.step, "time": e.time, **e.data}


def event_of(row: dict[str, Any]) -> Event:
    """An ``events.jsonl`` row as an :class:`Event` (the inverse of how the recorder writes it)."""
    try:
        data = dict(row)
        kind, step, time = data.pop("kind"), data.pop("step"), data.pop("time", None)
        return Event(EventKind(kind), step, data, time)
    except (KeyError, ValueError, TypeError):
        raise RecordError(f"not an rlvr event: {str(row)[:80]}") from None


@dataclass(frozen=True)
class RunRecord:
    """A run's record, in memory or read back from disk by :func:`read_record`."""

    path: Path | None
    run: dict[str, Any]
    events: list[Event]
    metrics: list[dict[str, Any]]
    selected: dict[str, Any] | None
    samples: dict[int, list[dict[str, Any]]] = field(default_factory=dict)  # step -> sample rows

    def of_kind(self, kind: EventKind) -> list[Event]:
        return [e for e in self.events if e.kind == kind]

    @property
    def heldout_scores(self) -> dict[int, float]:
        return {e.step: e.data["score"] for e in self.of_kind(EventKind.HELDOUT)}

    @property
    def pool_scores(self) -> dict[int, float]:
        return {e.step: e.data["pool_score"] for e in self.of_kind(EventKind.STEP)}

    @property
    def selected_step(self) -> int | None:
        return None if self.selected is None else self.selected["step"]

    @property
    def finished(self) -> Event | None:
        done = self.of_kind(EventKind.FINISHED)
        return done[-1] if done else None

    @property
    def selected_checkpoint(self) -> Path | None:
        """The folder of the checkpoint held-out selected (its ``trainer/`` holds the adapter or weights);
        ``None`` in memory or before a selection."""
        if self.path is None or self.selected is None or not self.selected.get("checkpoint"):
            return None
        return self.path / self.selected["checkpoint"]

    @property
    def summary(self) -> dict[str, Any] | None:
        """The finished run's summary digest (scores, gain, gap, stop cause); ``None`` before it finished."""
        done = self.finished
        return None if done is None else done.data.get("summary")


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    lines = path.read_text(encoding="utf-8").split("\n")
    rows = []
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError as exc:
            if i == len(lines):  # a torn final line (no newline yet) from a crash mid-write
                break
            raise RecordError(f"{path}:{i}: not a JSON line ({exc})") from None
    return rows


def _read_json(path: Path) -> dict[str, Any]:
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise RecordError(f"{path} cannot be read ({type(exc).__name__}: {exc}); `rlvr resume` rebuilds it from "
                          "the newest checkpoint") from None
    if not isinstance(value, dict):
        raise RecordError(f"{path} does not hold a JSON object")
    return value


def _sample_files(root: Path) -> list[tuple[int, Path]]:
    found = ((f.stem.removeprefix("step_"), f) for f in (root / SAMPLES_DIR).glob("step_*.jsonl"))
    return sorted((int(n), f) for n, f in found if n.isdigit())


def read_record(path: str | os.PathLike[str]) -> RunRecord:
    """Load a run folder back into a :class:`RunRecord`."""
    root = Path(path)
    if not (root / "run.json").exists():
        raise RecordError(f"{root}: no run.json here; is this a run folder?")
    run = _read_json(root / "run.json")
    events = []
    for i, row in enumerate(_read_jsonl(root / "events.jsonl"), 1):
        try:
            events.append(event_of(row))
        except RecordError:
            raise RecordError(f"{root / 'events.jsonl'}: event {i} is not an rlvr event") from None
    sel_path = root / "selected.json"
    selected = _read_json(sel_path) if sel_path.exists() else None
    samples = {step: _read_jsonl(file) for step, file in _sample_files(root)}
    return RunRecord(root, run, events, _read_jsonl(root / "metrics.jsonl"), selected, samples)


def describe(seam: Any) -> dict[str, Any]:
    """What the run record says about a seam."""
    custom = getattr(seam, "describe", None)
    if callable(custom):
        return dict(custom())
    kind = seam if callable(seam) and hasattr(seam, "__qualname__") else type(seam)
    return {"type": f"{getattr(kind, '__module__', '?')}.{getattr(kind, '__qualname__', repr(kind))}"}


STATE_FILE = "loop_state.json"  # the loop's state, in every checkpoint folder
TRAINER_DIR = "trainer"  # the trainer's own state (save/load), beside it


def complete_checkpoints(run_dir: str | Path) -> list[Path]:
    """A run folder's checkpoints whose loop state was written (complete ones), oldest first; folders
    set aside (``step_N.corrupt``) or half written (``step_N.tmp``) are not checkpoints."""
    return sorted(p for p in (Path(run_dir) / "checkpoints").glob("step_*")
                  if p.name[len("step_"):].isdigit() and (p / STATE_FILE).exists())


def checkpoint_name(step: int) -> str:
    """A checkpoint's folder, relative to the run folder (records never hold absolute paths)."""
    return f"checkpoints/step_{step:06d}"


def sample_file(step: int) -> str:
    """The samples of ``step``, inside ``samples/`` (numbered like the checkpoints, so they sort)."""
    return f"step_{step:06d}.jsonl"
