"""Resident memory of this process, read without third-party packages, and the per-phase trace.

Used for the per-phase memory trace in the run record (:class:`PhaseTrace`), the memory watchdog
(:mod:`rlvr.run.watchdog`) and progress reports. Standard library only.
"""

from __future__ import annotations

import os
import resource
import sys


def rss_mb() -> float | None:
    """Current resident set size in MiB (Linux); None where it cannot be read."""
    try:
        with open("/proc/self/statm", encoding="ascii") as f:
            pages = int(f.read().split()[1])
        return pages * os.sysconf("SC_PAGE_SIZE") / 2**20
    except (OSError, ValueError, IndexError):
        return None


def peak_rss_mb() -> float:
    """Peak resident set size of this process so far, in MiB."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 2**20 if sys.platform == "darwin" else peak / 1024


class PhaseTrace:
    """Peak memory per loop phase (sample, train, held-out, checkpoint), over the whole run and over
    each phase's latest run (its *episode*: this step's sampling, this evaluation). Fed at every
    phase change by the loop and, between changes, by every watchdog sample: a peak is the highest
    reading taken while the phase ran (the process-lifetime peak, ``ru_maxrss``, cannot be split by
    phase). Reward scoring runs inside the rollout stream, concurrently with sampling, so it is part
    of the sample phase. Thread-safe."""

    def __init__(self) -> None:
        import threading

        self._lock = threading.Lock()
        self.phase: str | None = None
        self.run_peaks: dict[str, float] = {}
        self.episode_peaks: dict[str, float] = {}

    def enter(self, phase: str) -> None:
        """The loop moves to ``phase``: the reading now closes the old phase and opens the new one."""
        now = rss_mb()
        self.observe_mb(now, None)
        with self._lock:
            self.phase = str(phase)
            for key in (f"{phase}_peak_mb", f"{phase}_cuda_peak_mb"):
                self.episode_peaks.pop(key, None)
        self.observe_mb(now, None)

    def observe(self, sample: object) -> None:
        """A watchdog sample (anything with ``rss_mb`` and ``cuda_used_mb``)."""
        self.observe_mb(getattr(sample, "rss_mb", None), getattr(sample, "cuda_used_mb", None))

    def observe_mb(self, rss: float | None, cuda: float | None) -> None:
        with self._lock:
            if self.phase is None:
                return
            for key, value in ((f"{self.phase}_peak_mb", rss), (f"{self.phase}_cuda_peak_mb", cuda)):
                if value is not None:
                    for peaks in (self.run_peaks, self.episode_peaks):
                        peaks[key] = max(peaks.get(key, 0.0), round(value, 1))

    def closing(self, *phases: str) -> dict[str, float]:
        """``mem/*`` figures of the latest episode of each of ``phases``, read as the last of them
        closes (a reading now, also when no watchdog sample fell inside it)."""
        self.observe_mb(rss_mb(), None)
        return {f"mem/{k}": v for k, v in self.latest(*phases).items()}

    def step_figures(self, last: object | None) -> dict[str, float]:
        """A train step's ``mem/*`` figures: its sample and train peaks, and the watchdog's ``last``
        sample (its own ``figures()``, but the RSS the step row already has)."""
        figures = {k: v for k, v in (last.figures() if last is not None else {}).items()  # type: ignore[attr-defined]
                   if k != "rss_mb"}
        return {**self.closing("sample", "train"), **{f"mem/{k}": v for k, v in figures.items()}}

    def latest(self, *phases: str) -> dict[str, float]:
        """The peaks of the latest episode of each of ``phases``."""
        with self._lock:
            return {k: v for k, v in self.episode_peaks.items() if k.split("_", 1)[0] in phases}
