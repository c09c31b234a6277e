"""The memory watchdog: stop a run cleanly before the kernel's OOM killer does.

A background thread samples memory every ``interval_s``: this process's RSS and the system's
available memory (``/proc/meminfo`` ``MemAvailable``), plus accelerator memory where a reader for it
is injected (the CLI passes one when torch sees a GPU; this module never imports torch). Each
sample is judged against two levels:

- **warn**: available memory under ``warn_available_frac`` of the total, RSS over ``warn_rss_mb``,
  or accelerator free memory under ``cuda_warn_frac``. Reported once per breach (logged and queued
  for the run record); a new warning needs the level to clear first.
- **floor**: available under ``floor_available_frac``, RSS over ``max_rss_mb``, or accelerator free
  under ``cuda_floor_frac``. A floor breach that persists for ``persist_s`` (every sample in that
  window below the floor) *trips* the watchdog: ``tripped`` turns true and stays true, with the
  reason and the figures. One sample above the floor resets the persistence clock.

The available-memory floor guards this run against the OOM killer, so where ``oom_choice`` is given
(the CLI passes :func:`kernel_oom_choice`) it counts only while the process the kernel would kill
first is this one or one of its children (its servers, workers): a machine short of memory because
another job grew stops that job first, and this run goes on with a warning naming it. The RSS and
accelerator floors always count.

The watchdog never stops anything itself: the loop polls it between steps, so a breach during a step
stops the run at the next safe point (after the step in progress, its held-out evaluation and
checkpoint), where it records the reason and writes a resumable checkpoint. Set the floor with
room for one step's growth.

Every sample also feeds ``observer`` (the loop's per-phase memory trace). Thread-safe.
Standard library only.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from rlvr.run.memory import rss_mb


@dataclass(frozen=True, slots=True)
class MemorySample:
    """One reading, in MiB; ``None`` where it cannot be read on this machine."""

    rss_mb: float | None
    available_mb: float | None = None
    total_mb: float | None = None
    cuda_used_mb: float | None = None
    cuda_total_mb: float | None = None

    def figures(self) -> dict[str, float]:
        return {k: round(v, 1) for k, v in asdict(self).items() if v is not None}


def meminfo_mb() -> tuple[float | None, float | None]:
    """``(MemAvailable, MemTotal)`` from ``/proc/meminfo`` in MiB; ``(None, None)`` where absent."""
    found: dict[str, float] = {}
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                key, _, rest = line.partition(":")
                if key in ("MemAvailable", "MemTotal"):
                    found[key] = int(rest.split()[0]) / 1024  # kB
    except (OSError, ValueError, IndexError):
        return None, None
    return found.get("MemAvailable"), found.get("MemTotal")


CudaReader = Callable[[], tuple[float, float]]  # () -> (used MiB, total MiB) of the run's device


def system_reader(cuda: CudaReader | None = None) -> Callable[[], MemorySample]:
    """The reader the watchdog uses by default: RSS, ``/proc/meminfo``, and ``cuda()`` when given."""

    def read() -> MemorySample:
        available, total = meminfo_mb()
        used, cuda_total = cuda() if cuda is not None else (None, None)
        return MemorySample(rss_mb(), available, total, used, cuda_total)

    return read


@dataclass(frozen=True, slots=True)
class OomChoice:
    """The process the kernel's OOM killer would kill first now (the highest ``/proc/PID/oom_score``)
    and whether it is the run's own (this process or a descendant)."""

    pid: int
    name: str
    ours: bool

    def __str__(self) -> str:
        return f"pid {self.pid} ({self.name})"


def kernel_oom_choice(own_pid: int | None = None, proc: str = "/proc") -> OomChoice | None:
    """Who the OOM killer would pick, read from ``proc``; ``None`` where it cannot be read (not Linux,
    no process readable). Ties go to the run: the kernel's pick among equals is not ours to predict."""
    own = os.getpid() if own_pid is None else own_pid
    rows: dict[int, tuple[int, int, str]] = {}  # pid -> (parent pid, oom_score, name)
    try:
        entries = [int(e) for e in os.listdir(proc) if e.isdigit()]
    except OSError:
        return None
    for pid in entries:
        try:
            with open(os.path.join(proc, str(pid), "stat"), encoding="utf-8", errors="replace") as f:
                head, _, tail = f.read().rpartition(")")  # "pid (name) state ppid ...": a name may hold ")"
            with open(os.path.join(proc, str(pid), "oom_score"), encoding="ascii") as f:
                score = int(f.read())
            rows[pid] = (int(tail.split()[1]), score, head.partition("(")[2])
        except (OSError, ValueError, IndexError):
            continue  # gone meanwhile, or unreadable
    if not rows:
        return None
    top = max(score for _, score, _ in rows.values())
    firsts = sorted(pid for pid, (_, score, _) in rows.items() if score == top)
    parents = {pid: row[0] for pid, row in rows.items()}
    ours = [pid for pid in firsts if _descends(pid, own, parents)]
    pid = (ours or firsts)[0]
    return OomChoice(pid, rows[pid][2], bool(ours))


def _descends(pid: int, ancestor: int, parents: dict[int, int]) -> bool:
    """Whether ``pid`` is ``ancestor`` or below it in the process tree ``parents`` (pid -> parent pid)."""
    seen: set[int] = set()
    while pid not in seen:
        if pid == ancestor:
            return True
        seen.add(pid)
        if pid not in parents:
            return False
        pid = parents[pid]
    return False


@dataclass(frozen=True, slots=True)
class WatchdogLevels:
    """Warn and floor levels (see the module docstring); ``None`` turns a level off."""

    interval_s: float = 0.5
    persist_s: float = 2.0
    warn_available_frac: float | None = 0.10
    floor_available_frac: float | None = 0.05
    warn_rss_mb: float | None = None
    max_rss_mb: float | None = None
    cuda_warn_frac: float | None = 0.10
    cuda_floor_frac: float | None = 0.05


def _below(sample: MemorySample, avail_frac: float | None, rss_cap: float | None,
           cuda_frac: float | None, word: str) -> list[str]:
    """Each way ``sample`` is past one set of levels, in words with the figures."""
    out = []
    if avail_frac is not None and sample.available_mb is not None and sample.total_mb:
        if sample.available_mb < avail_frac * sample.total_mb:
            out.append(f"available memory {sample.available_mb:.0f} MiB is "
                       f"{sample.available_mb / sample.total_mb:.1%} of {sample.total_mb:.0f} MiB, "
                       f"under the {word} of {avail_frac:.0%}")
    if rss_cap is not None and sample.rss_mb is not None and sample.rss_mb > rss_cap:
        out.append(f"this process's RSS {sample.rss_mb:.0f} MiB is over the {word} of {rss_cap:.0f} MiB")
    if cuda_frac is not None and sample.cuda_used_mb is not None and sample.cuda_total_mb:
        free = sample.cuda_total_mb - sample.cuda_used_mb
        if free < cuda_frac * sample.cuda_total_mb:
            out.append(f"accelerator free memory {free:.0f} MiB is {free / sample.cuda_total_mb:.1%} of "
                       f"{sample.cuda_total_mb:.0f} MiB, under the {word} of {cuda_frac:.0%}")
    return out


class MemoryWatchdog:
    """Samples memory on a thread; ``tripped`` once a floor breach has persisted ``persist_s``.

    ``reader`` returns a :class:`MemorySample` (default :func:`system_reader`); ``clock`` is
    monotonic seconds; ``log`` prints warnings and the trip as they happen. :meth:`check` judges
    one sample (the thread calls it; tests call it directly with a fake reader and clock).
    """

    def __init__(self, levels: WatchdogLevels = WatchdogLevels(), *,
                 reader: Callable[[], MemorySample] | None = None, clock: Callable[[], float] = time.monotonic,
                 log: Callable[[str], None] | None = print,
                 oom_choice: Callable[[], OomChoice | None] | None = None):
        if levels.interval_s <= 0 or levels.persist_s < 0:
            raise ValueError(f"watchdog interval_s must be > 0 and persist_s >= 0, got {levels.interval_s} "
                             f"and {levels.persist_s}")
        self.levels, self.reader, self.clock, self.log = levels, reader or system_reader(), clock, log
        self.oom_choice = oom_choice
        self._spared_by: str | None = None  # under the floor: the other process the OOM killer would take first
        self.observer: Callable[[MemorySample], None] | None = None
        self.last: MemorySample | None = None
        self.min_available_mb: float | None = None
        self.samples = 0
        self.abort_reason: str | None = None
        self.abort_details: dict[str, Any] = {}
        self._breach_since: float | None = None
        self._warning_now = False
        self._warnings: list[dict[str, Any]] = []
        self.warnings_total = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def tripped(self) -> bool:
        return self.abort_reason is not None

    def check(self) -> MemorySample:
        """Read and judge one sample; returns it."""
        sample = self.reader()
        now = self.clock()
        lv = self.levels
        available = _below(sample, lv.floor_available_frac, None, None, "floor")
        others = _below(sample, None, lv.max_rss_mb, lv.cuda_floor_frac, "floor")
        first = self.oom_choice() if available and self.oom_choice else None
        # The kernel would take another process first: the available floor is not this run's to answer.
        spared_by = str(first) if first is not None and not first.ours else None
        spared = [f"the OOM killer would stop {spared_by} first, not this run"] if spared_by else []
        floor = others if spared_by else available + others
        warn = (available + spared + others
                or _below(sample, lv.warn_available_frac, lv.warn_rss_mb, lv.cuda_warn_frac, "warn level"))
        message = None
        with self._lock:
            self.last, self.samples = sample, self.samples + 1
            if sample.available_mb is not None and (self.min_available_mb is None
                                                    or sample.available_mb < self.min_available_mb):
                self.min_available_mb = sample.available_mb
            if warn and (not self._warning_now or spared_by != self._spared_by):
                # Figures under mem/: wall-clock-like values, which strip_timing removes from a record.
                self._warnings.append({"source": "memory_watchdog", "message": "; ".join(warn),
                                       **{f"mem/{k}": v for k, v in sample.figures().items()}})
                self.warnings_total += 1
                message = f"memory warning: {'; '.join(warn)}"
            self._warning_now, self._spared_by = bool(warn), spared_by
            if not floor:
                self._breach_since = None
            elif not self.tripped:
                self._breach_since = now if self._breach_since is None else self._breach_since
                lasted = now - self._breach_since
                if lasted >= lv.persist_s:
                    self.abort_reason = (f"memory watchdog: {'; '.join(floor)}, for {lasted:.1f}s "
                                         f"(persist_s = {lv.persist_s})")
                    self.abort_details = {"source": "memory_watchdog", "breach_s": round(lasted, 2),
                                          **{f"mem/{k}": v for k, v in sample.figures().items()}}
                    message = f"{message + chr(10) if message else ''}{self.abort_reason}; stopping at the next step"
        if self.observer is not None:
            self.observer(sample)
        if message and self.log is not None:
            self.log(f"rlvr: {message}")
        return sample

    def take_warnings(self) -> list[dict[str, Any]]:
        """Warnings not yet handed out (each once), for the run record."""
        with self._lock:
            out, self._warnings = self._warnings, []
        return out

    def summary(self) -> dict[str, Any]:
        """Figures for the finished event: samples taken, warnings, lowest available memory."""
        with self._lock:
            return {"mem/watchdog_samples": self.samples, "mem/watchdog_warnings": self.warnings_total,
                    **({"mem/min_available_mb": round(self.min_available_mb, 1)}
                       if self.min_available_mb is not None else {})}

    # ---- the thread -----------------------------------------------------------------------
    def start(self, observer: Callable[[MemorySample], None] | None = None) -> None:
        """Sample every ``interval_s`` on a daemon thread until :meth:`stop`."""
        self.observer = observer
        if self._thread is not None:
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="rlvr-memory-watchdog", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5 * self.levels.interval_s + 1)
            self._thread = None

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.check()
            except Exception as exc:  # noqa: BLE001 - a reader failing must not kill the run it guards
                if self.log is not None:
                    self.log(f"rlvr: memory watchdog cannot read memory ({type(exc).__name__}: {exc}); "
                             "it stops sampling")
                return
            self._stop.wait(self.levels.interval_s)
