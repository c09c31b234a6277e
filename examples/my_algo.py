"""A user's own algorithm and an echo token filter, named from a config file:

    [algo]
    type = "custom"
    import_path = "examples/my_algo.py:Contrast"
    kwargs = { scale = 0.5 }

    [algo]                      # or: echo, trained only on the first tokens of each tool answer
    type = "echo"
    import_path = "examples/my_algo.py:first_env_tokens"
    kwargs = { n = 8 }
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from rlvr.algos import Algorithm, broadcast
from rlvr.types import Group, Rollout, Task


class Contrast(Algorithm):
    """+scale on every sample that beat the group's worst reward, −scale on the worst ones: a
    contrastive credit that needs no standard deviation (and so no epsilon for equal rewards)."""

    name: ClassVar[str] = "contrast"
    components: ClassVar[tuple[str, ...]] = ("rl",)

    def __init__(self, scale: float = 1.0):
        self.scale = float(scale)

    def assign(self, task: Task, samples) -> Group:
        rewards = [float(sample[-1].reward) for sample in samples]
        worst = min(rewards)
        return Group(task, tuple(dataclasses.replace(r, advantages=broadcast(r, self.scale if reward > worst
                                                                               else -self.scale))
                                 for sample, reward in zip(samples, rewards, strict=True) for r in sample))

    def describe(self) -> dict:
        return {**super().describe(), "scale": self.scale}


def first_env_tokens(segments: tuple[Rollout, ...], n: int = 8) -> list[list[bool]]:
    """echo's filter: keep the first ``n`` tokens of each stretch the environment added, drop the rest."""
    masks = []
    for r in segments:
        keep, run = [], 0
        for m in r.mask:
            run = 0 if m else run + 1
            keep.append(bool(m) or run <= n)
        masks.append(keep)
    return masks
