"""How a change in score is said: "points" only for rewards in [0, 1], the plain change otherwise.

"+12.5 points" reads as percentage points of accuracy, which is what a score is when every reward lies
in [0, 1] (a pass rate, a fraction of the answer right). A reward outside it (a length penalty of
-46.55, a judge's 1-10 scale) has no percentage: its change is said as a change, ``+0.88``. The range
is what the run saw: every training sample's reward (the ``rollout/reward_min`` / ``rollout/reward_max``
metrics of each step) and every evaluation score; a run that saw nothing outside [0, 1] reads in points.
Standard library only.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

__all__ = ["RANGE_KEYS", "change_text", "in_unit_interval", "observed_in_unit_interval"]

RANGE_KEYS = ("rollout/reward_min", "rollout/reward_max")


def in_unit_interval(values: Iterable[float | None]) -> bool:
    return all(v is None or (math.isfinite(v) and 0.0 <= v <= 1.0) for v in values)


def observed_in_unit_interval(metrics: Sequence[Mapping[str, Any]], *scores: Mapping[int, float]) -> bool:
    """Whether every reward and score the run recorded lies in [0, 1]: each step's sample range
    (:data:`RANGE_KEYS`) and the given score series (held-out, pool, training rows scored)."""
    ranges = [m[k] for m in metrics for k in RANGE_KEYS if isinstance(m.get(k), (int, float))]
    return in_unit_interval(ranges) and all(in_unit_interval(s.values()) for s in scores)


def change_text(before: float, after: float, unit_interval: bool) -> str:
    """``"+12.5 points"`` for rewards in [0, 1], else the plain change, ``"+0.880"``."""
    if unit_interval:
        return f"{(after - before) * 100:+.1f} points"
    return f"{after - before:+.3f}"
