"""``grpo``: policy gradient on sampled tokens, credit from the reward by the run's estimator.

Every estimator of ``loop.advantage`` (:mod:`rlvr.algos.advantages`): the group-relative ones
(``grpo``, ``dr_grpo``, ``rloo``) at group time, and the batch ones at batch time:
``reinforce_pp`` (REINFORCE++: the outcome reward whitened over every trainable token of the
batch), ``reinforce_pp_baseline`` (group mean subtracted, then whitened the same way) and
``global_baseline`` (the batch's mean reward as the baseline). With ``gae`` the group carries no
advantages: each rollout's reward sits on its last trained token (``token_rewards``) and the
trainer's critic turns it into per-token advantages by GAE (:mod:`rlvr.backends.train.critic`). An
episode of several training segments is refused there: GAE scans one token sequence and cannot
carry a value from one segment into the next. Components: ``rl``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any, ClassVar

from rlvr.algos import advantages as estimators
from rlvr.algos.base import Algorithm, Samples, credit_samples, final_rewards
from rlvr.errors import RLLoopError
from rlvr.types import Group, Rollout, Task

BATCH_ESTIMATORS = ("reinforce_pp", "reinforce_pp_baseline", "global_baseline")
CRITIC_ESTIMATORS = ("gae",)


class GRPO(Algorithm):
    name: ClassVar[str] = "grpo"
    components: ClassVar[tuple[str, ...]] = ("rl",)

    def __init__(self, advantage: str = "grpo"):
        known = [*estimators.ADVANTAGES, *BATCH_ESTIMATORS, *CRITIC_ESTIMATORS]
        if advantage not in known:
            raise ValueError(f"advantage {advantage!r} is not one of {sorted(known)}")
        self.advantage = advantage

    @property
    def group_relative(self) -> bool:  # type: ignore[override]
        return self.advantage in estimators.ADVANTAGES

    @property
    def needs_critic(self) -> bool:  # type: ignore[override]
        return self.advantage in CRITIC_ESTIMATORS

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
        if self.needs_critic:
            return Group(task, tuple(_rewarded_last(task, sample) for sample in samples))
        return credit_samples(task, samples, self.per_sample(final_rewards(samples)))

    def finalize(self, groups: Sequence[Group]) -> list[Group]:
        if self.advantage == "global_baseline":
            return _shift_by_batch_mean(groups)
        if self.advantage in ("reinforce_pp", "reinforce_pp_baseline"):
            return _whitened(groups)
        return list(groups)

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "advantage": self.advantage}


def _rewarded_last(task: Task, sample: Sequence[Rollout]) -> Rollout:
    """The sample's one rollout with its reward on its last trained token (0 elsewhere), for the critic."""
    if len(sample) != 1:
        raise RLLoopError(f"row {task.id!r}: an episode of {len(sample)} training segments; loop.advantage = 'gae' "
                          "scans one token sequence per sample and cannot carry the critic's values from one "
                          "segment into the next: use an environment whose episodes stay one segment, or another "
                          "loop.advantage")
    r = sample[0]
    last = max((i for i, m in enumerate(r.mask) if m), default=None)
    rewards = tuple(float(r.reward) if i == last else 0.0 for i in range(len(r.completion_ids)))  # type: ignore[arg-type]
    return dataclasses.replace(r, advantages=None, token_rewards=rewards)


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
