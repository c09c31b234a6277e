"""Credit shaping: what a run does to a scored group around its algorithm's credit, configured once.

:meth:`Shaping.credit` is the one call the rollout stream makes per scored group. It runs in two
places, each where its formula needs to be:

- **before** the algorithm credits the group, on the rewards (so every estimator and baseline sees
  the shaped reward), each shaping term recorded as a reward component on the sample (the run
  records their means as ``reward/<name>``):

  - ``overlong`` — DAPO's soft overlong punishment. With budget B (``max_tokens``), buffer b and
    penalty p, a completion of L generated tokens gets min(−(L − (B − b))/b · p, 0): 0 up to B − b
    tokens, then linear down to −p at the full budget (verl's DAPO reward manager; TRL's
    ``get_soft_overlong_punishment`` with p = 1);
  - ``length`` — a length penalty scaled by the group's success: −w · μ · L / max_j L_j, with μ the
    group's mean reward before shaping and the longest completion of the group as the unit
    (prime-rl's linear ``length_penalty`` on output tokens); a group that fails everywhere (μ = 0)
    is not pushed to be short. Meant for rewards >= 0, where μ is a success rate;

  and ``unshaped``, the reward before shaping, so the task's own score stays visible;
- **after** the credit, on the streams: with ``mask_truncated``, a rollout whose generation the
  token budget cut (stop reason ``length``) gets rl weight 0 on every token, so it carries no
  policy-gradient signal while its reward still counts in its group's baseline (TRL's
  ``mask_truncated_completions``). The ``ce`` and ``ref_kl`` components are left as they are: a
  per-token distillation signal does not depend on the completion's end.

L is the sample's generated tokens (its loss-mask tokens, over all its segments). An inactive
shaping is the identity: the algorithm's group is returned as it is. Standard library only.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from rlvr.errors import ConfigError
from rlvr.types import Group, Rollout, StopReason, Task

if TYPE_CHECKING:
    from rlvr.algos import Algorithm

Samples = Sequence[Sequence[Rollout]]


@dataclass(frozen=True, slots=True)
class Shaping:
    """Reward shaping before the credit and truncation masking after it (see the module docstring)."""

    mask_truncated: bool = False
    overlong_buffer: int | None = None
    overlong_penalty: float = 1.0
    length_penalty: float = 0.0
    max_tokens: int | None = None  # the token budget the overlong buffer ends at

    def __post_init__(self) -> None:
        if self.overlong_buffer is not None:
            if self.max_tokens is None:
                raise ConfigError("overlong_buffer sits at the end of the token budget: give max_tokens too")
            if not 1 <= self.overlong_buffer <= self.max_tokens:
                raise ConfigError(f"overlong_buffer={self.overlong_buffer} must be within 1..max_tokens="
                                  f"{self.max_tokens}")
        if not (math.isfinite(self.overlong_penalty) and self.overlong_penalty > 0):
            raise ConfigError(f"overlong_penalty={self.overlong_penalty} must be a finite number > 0")
        if not (math.isfinite(self.length_penalty) and self.length_penalty >= 0):
            raise ConfigError(f"length_penalty={self.length_penalty} must be a finite number >= 0")

    @property
    def shapes_rewards(self) -> bool:
        return self.overlong_buffer is not None or self.length_penalty > 0

    def credit(self, algorithm: Algorithm, task: Task, samples: Samples) -> Group:
        """``algorithm``'s credit of ``samples``, their rewards shaped before, truncation masked after."""
        shaped = self.shape_rewards(samples) if self.shapes_rewards else samples
        group = algorithm.credit(task, shaped)
        return self.mask_truncated_rollouts(group) if self.mask_truncated else group

    def shape_rewards(self, samples: Samples) -> list[list[Rollout]]:
        """Each sample with its reward shaped and each term recorded in its metrics (every segment of
        an episode shares the episode's reward and metrics)."""
        rewards = [float(sample[-1].reward) for sample in samples]  # type: ignore[arg-type]
        lengths = [sum(sum(r.mask) for r in sample) for sample in samples]
        terms: dict[str, list[float]] = {}
        if self.overlong_buffer is not None:
            terms["overlong"] = [self.overlong(n) for n in lengths]
        if self.length_penalty > 0:
            terms["length"] = length_penalties(rewards, lengths, self.length_penalty)
        out = []
        for i, sample in enumerate(samples):
            added = {name: values[i] for name, values in terms.items()}
            reward = rewards[i] + math.fsum(added.values())
            metrics = {**sample[-1].metrics, **added, "unshaped": rewards[i]}
            out.append([dataclasses.replace(r, reward=reward, metrics=metrics) for r in sample])
        return out

    def overlong(self, length: int) -> float:
        """DAPO's penalty for ``length`` generated tokens: min(−(L − (B − b))/b · p, 0)."""
        b, budget = self.overlong_buffer, self.max_tokens
        assert b is not None and budget is not None
        return min(-(length - (budget - b)) / b * self.overlong_penalty, 0.0)

    @staticmethod
    def mask_truncated_rollouts(group: Group) -> Group:
        """``group`` with rl weight 0 on every token of each rollout the budget cut."""
        def masked(r: Rollout) -> Rollout:
            if r.stop_reason != StopReason.LENGTH:
                return r
            return dataclasses.replace(r, rl_weights=(0.0,) * len(r.completion_ids))

        return Group(group.task, tuple(masked(r) for r in group.rollouts))


def length_penalties(rewards: Sequence[float], lengths: Sequence[int], weight: float) -> list[float]:
    """−w · μ · L_i / max_j L_j per sample (μ the group's mean reward); zeros when nothing was generated."""
    longest = max(lengths, default=0)
    if longest == 0:
        return [0.0] * len(lengths)
    mu = math.fsum(rewards) / len(rewards)
    return [-weight * mu * n / longest for n in lengths]
