"""Wall time per phase of an RL step, measured from outside a library, for the benchmarks.

A :class:`PhaseClock` counts, per phase, the wall time during which at least one call of that phase
was running: the union of the calls' intervals, not their sum. So phases that run concurrently
(rewards scored in worker threads beside one another) count once, and a phase timed by wrapping a
method that is called several times a step adds up correctly. Phases are timed either by wrapping a
callable (:meth:`PhaseClock.patch`) or by explicit ``start``/``stop`` (from a library's callbacks).

The split a benchmark prints (:data:`PHASES`) is generate / score (reward) / forward-backward /
optimizer / sync, plus ``other``: the step's wall time that none of them covers (bookkeeping, data
loading, record writes). Standard library only: the parent process of a benchmark imports this
without torch.
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

PHASES = ("generate", "score", "forward-backward", "optimizer", "sync", "other")


class PhaseClock:
    """Union-of-intervals wall time per phase name; thread-safe."""

    def __init__(self, clock: Callable[[], float] = time.perf_counter):
        self._clock, self._lock = clock, threading.Lock()
        self._open: dict[str, int] = {}
        self._since: dict[str, float] = {}
        self._total: dict[str, float] = {}

    def start(self, name: str) -> None:
        with self._lock:
            if self._open.get(name, 0) == 0:
                self._since[name] = self._clock()
            self._open[name] = self._open.get(name, 0) + 1

    def stop(self, name: str) -> None:
        with self._lock:
            count = self._open.get(name, 0)
            if count == 0:
                raise RuntimeError(f"phase {name!r} stopped without a start")
            self._open[name] = count - 1
            if count == 1:
                self._total[name] = self._total.get(name, 0.0) + self._clock() - self._since.pop(name)

    def wrap(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        """``fn`` timed under ``name`` (a plain function: a coroutine would only time its creation)."""
        @functools.wraps(fn)
        def timed(*args: Any, **kwargs: Any) -> Any:
            self.start(name)
            try:
                return fn(*args, **kwargs)
            finally:
                self.stop(name)
        return timed

    def patch(self, owner: Any, attr: str, name: str) -> None:
        """Replace ``owner.attr`` (a module function, a method of an instance) with its timed self.
        A missing attribute is an error naming it: the benchmark would otherwise report a phase
        it never measured."""
        fn = getattr(owner, attr, None)
        if not callable(fn):
            raise AttributeError(f"cannot time phase {name!r}: {getattr(owner, '__name__', type(owner).__name__)}."
                                 f"{attr} is not there any more; update the benchmark to the library's code")
        setattr(owner, attr, self.wrap(name, fn))

    def total(self, name: str) -> float:
        """Seconds of ``name`` so far, an interval still open included."""
        with self._lock:
            open_part = self._clock() - self._since[name] if self._open.get(name) else 0.0
            return self._total.get(name, 0.0) + open_part

    def totals(self) -> dict[str, float]:
        return {name: self.total(name) for name in sorted(self._total.keys() | self._since.keys())}


def split_per_step(phases: Mapping[str, float], wall_s: float, steps: int) -> dict[str, float]:
    """Seconds per step of each of :data:`PHASES` from run totals; ``other`` is the wall time the
    named phases leave uncovered (negative only where phases overlapped one another)."""
    known = {name: float(phases.get(name, 0.0)) for name in PHASES[:-1]}
    known["other"] = wall_s - sum(known.values())
    return {name: value / max(steps, 1) for name, value in known.items()}


def format_split(per_step: Mapping[str, float]) -> str:
    """``generate 1234 ms | score 5 ms | ...`` in :data:`PHASES` order."""
    return " | ".join(f"{name} {per_step.get(name, 0.0) * 1000:.0f} ms" for name in PHASES)
