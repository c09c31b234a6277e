"""``reward``: the raw reward as the advantage, no baseline (REINFORCE). Works with ``group_k = 1``;
with a reward that is never negative it only ever pushes probability up, so it suits rewards
centred by design (e.g. +1/−1). Components: ``rl``."""

from __future__ import annotations

from typing import ClassVar

from rlvr.algos.base import Algorithm, Samples, credit_samples, final_rewards
from rlvr.types import Group, Task


class RawReward(Algorithm):
    name: ClassVar[str] = "reward"
    components: ClassVar[tuple[str, ...]] = ("rl",)

    def assign(self, task: Task, samples: Samples) -> Group:
        return credit_samples(task, samples, final_rewards(samples))
