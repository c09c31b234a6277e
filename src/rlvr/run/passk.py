"""pass@k and mean@n over n sampled episodes per task: the figures ``rlvr eval`` reports.

pass@k is the unbiased estimator of Chen et al. (2021): with ``n`` samples of a task of which
``c`` pass, ``1 - C(n-c, k) / C(n, k)``, averaged over tasks; a sample passes when its reward
reaches ``threshold`` (1.0: a binary reward's "correct"). mean@n is the mean reward over every
sample. Sample ``j`` of task ``t`` is played with the seed of :class:`RolloutEvaluator` built with
``seed + j``, so sample 0 is exactly the run's own held-out episode. Invariant: nothing is
averaged around a missing sample: a task whose reward does not apply to a sample counts that
sample out of its own ``n``, and a k larger than a task's ``n`` leaves that task out of pass@k
(the report says how many tasks each figure covers).
Standard library only.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

from rlvr.errors import RLLoopError
from rlvr.types import EvalReport, Task


def pass_at_k(n: int, c: int, k: int) -> float:
    """Probability that at least one of ``k`` samples drawn without replacement from ``n``, of
    which ``c`` are correct, is correct: ``1 - C(n-c, k) / C(n, k)``."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def ks_for(n: int) -> list[int]:
    """1, 2, 4, ... up to ``n``, and ``n`` itself."""
    ks, k = [], 1
    while k <= n:
        ks.append(k)
        k *= 2
    return ks if ks[-1] == n else [*ks, n]


def sample_rewards(make_evaluator: Callable[[int], Any], step: int, tasks: Sequence[Task],
                   n: int) -> dict[str, list[float]]:
    """Reward of each of ``n`` episodes per task: ``make_evaluator(j)`` is the evaluator of sample
    ``j`` (an ``(step, tasks) -> EvalReport`` with per-task scores)."""
    rewards: dict[str, list[float]] = {t.id: [] for t in tasks}
    for j in range(n):
        report: EvalReport = make_evaluator(j)(step, list(tasks))
        if report.per_task is None:
            raise RLLoopError("the evaluator gave no per-task scores; pass@k needs them")
        for task_id, value in report.per_task.items():
            rewards[task_id].append(float(value))
    return rewards


def summarise(rewards: dict[str, list[float]], n: int, threshold: float = 1.0) -> dict[str, Any]:
    """pass@k for k in :func:`ks_for` (n), mean@n, and per task its rewards and passes."""
    counted = {tid: rs for tid, rs in rewards.items() if rs}
    if not counted:
        raise RLLoopError("the reward applied to none of the tasks' samples: nothing to score")
    figures: dict[str, Any] = {}
    for k in ks_for(n):
        tasks_k = [(len(rs), sum(r >= threshold for r in rs)) for rs in counted.values() if len(rs) >= k]
        if tasks_k:
            figures[f"pass@{k}"] = math.fsum(pass_at_k(m, c, k) for m, c in tasks_k) / len(tasks_k)
            figures[f"pass@{k}_tasks"] = len(tasks_k)
    every = [r for rs in counted.values() for r in rs]
    figures[f"mean@{n}"] = math.fsum(every) / len(every)
    per_task = {tid: {"rewards": rs, "passed": sum(r >= threshold for r in rs)} for tid, rs in rewards.items()}
    return {**figures, "tasks": len(counted), "tasks_without_reward": len(rewards) - len(counted),
            "per_task": per_task}
