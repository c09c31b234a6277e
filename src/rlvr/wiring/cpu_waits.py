"""How the CPU threads of rlvr's processes wait between parallel regions: asleep, not spinning.

torch's OpenMP threads spin after each parallel region by default (libgomp: up to 300,000 turns of
a loop before they sleep). Where another busy process shares the cores, the region's slowest thread
is one that waits for a CPU, and the others spend theirs spinning for it. Measured on 2 cores beside
one busy process, rlvr at ``nice -n 10``: 2,000 products of 256×256 matrices on 2 threads took 27 s
spinning and 1.3 s asleep; the CPU demo took over 400 s spinning (still in its warm start) and 96 s
asleep. On the same machine idle, asleep costs 9 % on the demo (82 s → 90 s). How a thread waits
does not change what it computes: both demos selected the same step with the same held-out score.

So the ``rlvr`` command sets ``OMP_WAIT_POLICY=PASSIVE`` before torch loads, for itself and for every
process it starts (trainer ranks, servers, render workers, Ray's workers: they inherit the
environment), unless ``OMP_WAIT_POLICY`` is already set: ``OMP_WAIT_POLICY=ACTIVE`` keeps the
spinning, a few per cent faster on a machine nothing else uses.
"""

from __future__ import annotations

import os
from collections.abc import MutableMapping

WAIT_POLICY = "OMP_WAIT_POLICY"


def threads_sleep_when_idle(environ: MutableMapping[str, str] = os.environ) -> str:
    """``OMP_WAIT_POLICY`` set to ``PASSIVE`` unless it is set; the policy now in force. Takes effect
    in this process only if torch has not loaded yet (OpenMP reads it once), and in every child."""
    return environ.setdefault(WAIT_POLICY, "PASSIVE")
