"""``max_rl``: GRPO's policy gradient with the MaxRL normalisation ``(r − μ)/μ`` (arXiv 2602.02710),
which maximises the log-likelihood of success rather than its probability. Components: ``rl``."""

from __future__ import annotations

from typing import ClassVar

from rlvr.algos.advantages import max_rl
from rlvr.algos.base import Algorithm, Samples, credit_samples, final_rewards
from rlvr.types import Group, Task


class MaxRL(Algorithm):
    name: ClassVar[str] = "max_rl"
    components: ClassVar[tuple[str, ...]] = ("rl",)
    group_relative: ClassVar[bool] = True

    def assign(self, task: Task, samples: Samples) -> Group:
        return credit_samples(task, samples, max_rl(final_rewards(samples)))
