"""One generation at a time per device: the gate every in-process engine on a device shares.

A run can hold several engines over models on one device: the rollout engine (live model or
replica) and the held-out evaluator's engine over the live model. Each decodes in its own worker
thread, so without a gate a held-out evaluation and the next step's rollouts would run two
``generate`` calls at once on one GPU, each slowing the other and both fighting for memory.
:func:`gate_for` gives every engine on a device the same :class:`DeviceGate`; an engine holds it
for each batch it generates or scores, so calls on a device are serialised, in arrival order as
the lock grants it.

The gate counts, per engine name, the calls made, the seconds spent waiting for the device and the
seconds holding it, and the most calls it ever saw inside at once (1 while the gate works): the run
record gets them (``perf/gen/*`` metrics), so "no overlap" is a recorded fact, not an assumption.

Invariant: at most one holder per device at any time; the counters only grow.

A backend module: imports torch (for device names).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch


@dataclass
class _Usage:
    calls: int = 0
    wait_s: float = 0.0
    busy_s: float = 0.0


class DeviceGate:
    """``with gate.hold("rlvr-engine"): generate(...)``: one holder at a time, counted by name."""

    def __init__(self, clock: Callable[[], float] = time.monotonic):
        self.clock = clock
        self._device = threading.Lock()
        self._books = threading.Lock()
        self._usage: dict[str, _Usage] = {}
        self.inside = 0  # holders right now
        self.most_inside = 0  # the most holders ever seen at once

    @contextmanager
    def hold(self, name: str) -> Iterator[None]:
        asked = self.clock()
        with self._device:
            granted = self.clock()
            with self._books:
                self.inside += 1
                self.most_inside = max(self.most_inside, self.inside)
                usage = self._usage.setdefault(name, _Usage())
                usage.calls += 1
                usage.wait_s += granted - asked
            try:
                yield
            finally:
                with self._books:
                    self.inside -= 1
                    usage.busy_s += self.clock() - granted

    def readings(self) -> dict[str, float]:
        """``perf/gen/<name>/calls``, ``/wait_s`` and ``/busy_s`` per engine name (totals
        since the gate was made) and ``perf/gen/most_at_once``."""
        with self._books:
            out: dict[str, float] = {"perf/gen/most_at_once": float(self.most_inside)}
            for name, usage in sorted(self._usage.items()):
                out[f"perf/gen/{name}/calls"] = float(usage.calls)
                out[f"perf/gen/{name}/wait_s"] = usage.wait_s
                out[f"perf/gen/{name}/busy_s"] = usage.busy_s
            return out


_GATES: dict[str, DeviceGate] = {}
_GATES_LOCK = threading.Lock()


def gate_for(device: torch.device | str) -> DeviceGate:
    """The one gate of ``device`` in this process (``cuda`` and ``cuda:0`` are the same device)."""
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    with _GATES_LOCK:
        return _GATES.setdefault(str(device), DeviceGate())
