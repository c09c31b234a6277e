"""``grpo``: policy gradient on sampled tokens, credit from the reward by the run's estimator.

Every estimator of ``loop.advantage`` (:mod:`rlvr.rollouts.advantages`): the group-relative ones
(``grpo``, ``dr_grpo``, ``rloo``) at group time, and the batch ones at batch time:
``reinforce_pp`` (REINFORCE++: the outcome reward whitened over every trainable token of the
batch), ``reinforce_pp_baseline`` (group mean subtracted, then whitened the same way) and
``global_baseline`` (the batch's mean reward as the baseline). Components: ``rl``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any, ClassVar

from rlvr.algos.base import Algorithm, Samples, credit_samples, final_rewards
from rlvr.rollouts import advantages as estimators
from rlvr.types import Group, Task

BATCH_ESTIMATORS = ("reinforce_pp", "reinforce_pp_baseline", "global_baseline")


class GRPO(Algorithm):
    name: ClassVar[str] = "grpo"
    components: ClassVar[tuple[str, ...]] = ("rl",)

    def __init__(self, advantage: str = "grpo"):
        if advantage not in estimators.ADVANTAGES and advantage not in BATCH_ESTIMATORS:
            raise ValueError(f"advantage {advantage!r} is not one of "
                             f"{sorted([*estimators.ADVANTAGES, *BATCH_ESTIMATORS])}")
        self.advantage = advantage

    @property
    def group_relative(self) -> bool:  # type: ignore[override]
        return self.advantage in estimators.ADVANTAGES

    def label(self) -> str:
        return f"algo.type = {self.name!r} with loop.advantage = {self.advantage!r}"

    def per_sample(self, rewards: list[float]) -> list[float]:
        """The scalar credit of each sample at group time."""
        if self.advantage == "reinforce_pp_baseline":
            return estimators.centred(rewards)
        if self.advantage in BATCH_ESTIMATORS:
            return rewards  # the batch statistics come in finalize
        return estimators.ADVANTAGES[self.advantage](rewards)

    def assign(self, task: Task, samples: Samples) -> Group:
        return credit_samples(task, samples, self.per_sample(final_rewards(samples)))

    def finalize(self, groups: Sequence[Group]) -> list[Group]:
        if self.advantage == "global_baseline":
            return _shift_by_batch_mean(groups)
        if self.advantage in ("reinforce_pp", "reinforce_pp_baseline"):
            return _whitened(groups)
        return list(groups)

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "advantage": self.advantage}


def _with_streams(groups: Sequence[Group], fn: Any) -> list[Group]:
    return [Group(g.task, tuple(dataclasses.replace(r, advantages=fn(r)) for r in g.rollouts)) for g in groups]


def _shift_by_batch_mean(groups: Sequence[Group]) -> list[Group]:
    """A = r − mean of the batch's rewards (one baseline for every row: works with group_k = 1)."""
    rewards = [r.reward for g in groups for r in g.rollouts]
    baseline = sum(rewards) / len(rewards) if rewards else 0.0  # type: ignore[arg-type]
    return _with_streams(groups, lambda r: tuple((r.reward - baseline) if m else 0.0 for m in r.mask))


def _whitened(groups: Sequence[Group]) -> list[Group]:
    """(A − μ)/sqrt(σ² + 1e-8) with μ, σ² over every rl token of the batch (token-weighted, as verl's
    REINFORCE++ whitens); tokens outside the rl mask stay 0."""
    values = [a * 1.0 for g in groups for r in g.rollouts
              for a, w in zip(r.advantages or (), r.rl_mask, strict=False) if w]
    mu, var = estimators.token_moments(values)
    scale = (var + 1e-8) ** -0.5
    return _with_streams(groups, lambda r: tuple((a - mu) * scale if w else 0.0
                                                  for a, w in zip(r.advantages or (), r.rl_mask, strict=True)))
