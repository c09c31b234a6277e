"""How much of a benchmark process's time its threads spent waiting for a core held by another process.

On a machine shared with other work, a library's wall times measure the machine as much as the
library: with as many torch threads as cores, every parallel region of a kernel waits for the
thread the scheduler has parked, and decoding (hundreds of tiny kernels a token) slows down far more
than the large matmuls of a forward-backward (on 2 shared cores the same ``generate`` call has been
seen to take 3 s on a quiet machine and over 90 s on a busy one). Linux counts, per thread, the time
it ran on a CPU and the time it was runnable but queued for one (``/proc/<pid>/task/*/schedstat``);
their sums over the process's threads say whether a run's figures are the library's or the machine's.

Invariant: a :class:`CpuShare` only reads counters; where schedstat is absent (not Linux, or the
kernel built without it) it reports ``None`` rather than a made-up zero. Standard library only.
"""

from __future__ import annotations

from pathlib import Path

# A process whose threads queued for this share of their runnable time ran on a busy machine: its
# times are inflated by others' work and not comparable with a run on a quiet one.
BUSY_SHARE = 0.10


def thread_seconds(pid: str = "self") -> tuple[float, float] | None:
    """(seconds on a CPU, seconds queued for one), summed over the live threads of ``pid``."""
    ran = queued = 0.0
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
    except OSError:
        return None
    for task in tasks:
        try:
            fields = (task / "schedstat").read_text().split()
            ran += int(fields[0]) / 1e9
            queued += int(fields[1]) / 1e9
        except FileNotFoundError:  # the thread ended since the listing: it takes its counts with it
            continue
        except (OSError, IndexError, ValueError):
            return None
    return ran, queued


class CpuShare:
    """CPU time and run-queue wait of this process since construction (threads that exited before
    :meth:`report` are not counted; torch's worker threads live as long as the process)."""

    def __init__(self) -> None:
        self._start = thread_seconds()

    def report(self) -> dict[str, float] | None:
        end = thread_seconds()
        if self._start is None or end is None:
            return None
        # Sums over the live threads: a thread that ended between the readings takes its counts with it,
        # which can make a difference slightly negative; none is below zero.
        ran, queued = max(0.0, end[0] - self._start[0]), max(0.0, end[1] - self._start[1])
        return {"ran_s": ran, "queued_s": queued, "queued_share": queued / (ran + queued) if ran + queued else 0.0}


def describe_share(share: dict[str, float] | None) -> str:
    """One line for a benchmark's report."""
    if share is None:
        return "CPU share: not measured (no /proc/<pid>/task/*/schedstat on this machine)"
    line = (f"CPU share: threads ran {share['ran_s']:.1f}s and queued {share['queued_s']:.1f}s for a core "
            f"({share['queued_share']:.0%} of their runnable time)")
    if share["queued_share"] >= BUSY_SHARE:
        line += ("; other processes held the cores, so these times are inflated: rerun on a quiet machine "
                 "before comparing them")
    return line
