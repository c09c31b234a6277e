"""Resident memory of this process, read without third-party packages.

Used for the per-phase memory trace in the run record and for progress reports.
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
