"""Held-out evaluation by sampling: score each held-out task's completion with the reward.

Greedy (temperature 0) by default, so a held-out score is a property of the weights rather than
of a sampling draw. Works over any sampler with the ``(tasks, k)`` shape.
Standard library only; the sampler it wraps carries the heavy imports.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from rlvr.batching import check_rollout, check_shape, score
from rlvr.seams import RewardFn, Sampler
from rlvr.types import EvalReport, Task


class SamplingEvaluator:
    """``(step, tasks) -> EvalReport``: mean reward of one completion per task."""

    def __init__(self, sampler: Sampler, reward_fn: RewardFn):
        self.sampler, self.reward_fn = sampler, reward_fn

    def __call__(self, step: int, tasks: Sequence[Task]) -> EvalReport:
        groups = self.sampler(tasks, 1)
        check_shape(step, tasks, groups, 1)
        for t, g in zip(tasks, groups, strict=True):
            check_rollout(g[0], t)
        per_task = {t.id: score(g[0], t, self.reward_fn).reward or 0.0 for t, g in zip(tasks, groups, strict=True)}
        return EvalReport(step=step, score=math.fsum(per_task.values()) / len(per_task), n=len(per_task),
                          per_task=per_task)

    def describe(self) -> dict[str, Any]:
        inner = getattr(self.sampler, "describe", None)
        return {"type": "rlvr.evaluation.SamplingEvaluator", "sampler": inner() if inner else None}
