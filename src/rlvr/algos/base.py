"""The algorithm seam: how a scored group becomes per-token credit, and what the trainer learns from it.

An :class:`Algorithm` has three execution points, each optional but ``assign``:

- ``assign(task, samples)`` at group time, when a row's samples are scored: returns the
  :class:`~rlvr.types.Group` whose rollouts carry the credit streams (per-token advantages and the
  ``rl`` / ``ce`` / ``ref_kl`` component weights, see :class:`~rlvr.types.Rollout`);
- ``score(group)`` right after, for the groups that survive the dynamic filter: reference
  log-probs from a frozen endpoint or the policy (bounded concurrency and timeouts live in the
  :class:`~rlvr.protocols.Scorer`). It runs while other rows are still sampling, so a teacher's
  latency hides behind sampling instead of delaying the train step;
- ``finalize(groups)`` at batch time, over this algorithm's groups in the batch: statistics that
  need the whole batch (REINFORCE++'s whitening, a batch baseline).

``samples_from_policy`` (default ``True``) says where an algorithm's rows are sampled: ``False`` (``sft``:
a frozen model) makes them frozen-sourced, so they carry no policy version and never age under the
staleness bound (:mod:`rlvr.rollouts.stream`).

``weight`` (``algo.weight``, default 1) scales every component weight an algorithm assigns, through
:meth:`Algorithm.credit`, the one entry point the stream calls. Each component is normalised over its
own tokens and the step's gradient is clipped as a whole, so in a run of several environments the
component with the larger gradient sets the direction of every step: the weight is how a mixed run
balances them (e.g. ``opd``'s reverse KL, several nats per token, beside ``grpo``'s unit-scale
advantages). The loop and the trainer never branch on the algorithm: the stream calls these hooks,
and the trainer executes the streams. Standard library only.
"""

from __future__ import annotations

import copy
import dataclasses
import math
from collections.abc import Sequence
from typing import Any, ClassVar

from rlvr.errors import ConfigError, RLLoopError
from rlvr.types import Group, Rollout, Task

Samples = Sequence[Sequence[Rollout]]  # one entry per sample: its rollout, or its episode's segments


class Algorithm:
    """Base class: subclasses set ``name`` and ``components`` and implement :meth:`assign`."""

    name: ClassVar[str]
    components: ClassVar[tuple[str, ...]]  # the loss components it routes tokens to
    group_relative: ClassVar[bool] = False  # needs group_k >= 2
    needs_critic: ClassVar[bool] = False  # its credit is token rewards a trainer's critic turns into advantages
    weight: float = 1.0  # scales every component weight it assigns (see with_weight)
    import_path: str | None = None  # where a user's subclass was loaded from (``algo.import_path``)
    samples_from_policy: ClassVar[bool] = True  # False: its rows come from a frozen model and never age

    def with_weight(self, weight: float) -> Algorithm:
        """This algorithm with its tokens counting ``weight`` times in the loss (a copy)."""
        if not (math.isfinite(weight) and weight > 0):
            raise ConfigError(f"algo.weight = {weight!r}: must be a finite number > 0")
        scaled = copy.copy(self)
        scaled.weight = float(weight)
        return scaled

    def credit(self, task: Task, samples: Samples) -> Group:
        """:meth:`assign`, with every component weight times :attr:`weight`: what the stream calls."""
        group = self.assign(task, samples)
        return group if self.weight == 1.0 else scaled(group, self.weight)

    def check(self, group_k: int) -> None:
        """Refuse, at load, a setting this algorithm cannot learn from (raise ConfigError naming the field)."""
        if self.group_relative and group_k < 2:
            raise ConfigError(f"loop.group_k = {group_k}: {self.label()} is group-relative (each sample is compared "
                              "with its group) and needs group_k >= 2; sample more per row, or pick a credit that "
                              "needs no group (loop.advantage = 'reinforce_pp' or 'global_baseline', algo.type = "
                              "'reward')")

    def label(self) -> str:
        return f"algo.type = {self.name!r}"

    def assign(self, task: Task, samples: Samples) -> Group:
        raise NotImplementedError

    async def score(self, group: Group) -> Group:
        return group

    def finalize(self, groups: Sequence[Group]) -> list[Group]:
        return list(groups)

    def describe(self) -> dict[str, Any]:
        return {"type": self.name, "components": list(self.components),
                **({"weight": self.weight} if self.weight != 1.0 else {}),
                **({"import_path": self.import_path} if self.import_path is not None else {})}


# ---- stream builders shared by the algorithms --------------------------------------------------
def broadcast(r: Rollout, value: float) -> tuple[float, ...]:
    """A rollout's scalar credit on each of its trainable tokens (0 elsewhere)."""
    return tuple(float(value) if m else 0.0 for m in r.mask)


def trainable(r: Rollout) -> tuple[float, ...]:
    """1.0 on each trainable (sampled) token, 0.0 on tokens the environment added."""
    return tuple(1.0 if m else 0.0 for m in r.mask)


def nothing(r: Rollout) -> tuple[float, ...]:
    return (0.0,) * len(r.completion_ids)


def scaled(group: Group, weight: float) -> Group:
    """Every component weight of every rollout times ``weight``. An absent ``rl_weights`` means the
    loss mask when the rollout has rl credit (advantages, or token rewards a critic turns into them),
    so it is spelled out before scaling."""

    def times(values: tuple[float, ...] | None) -> tuple[float, ...] | None:
        return None if values is None else tuple(weight * v for v in values)

    def one(r: Rollout) -> Rollout:
        no_rl_credit = r.advantages is None and r.token_rewards is None
        rl = r.rl_weights if r.rl_weights is not None or no_rl_credit else trainable(r)
        return dataclasses.replace(r, rl_weights=times(rl), ce_weights=times(r.ce_weights),
                                   ref_kl_weights=times(r.ref_kl_weights))

    return Group(group.task, tuple(one(r) for r in group.rollouts))


def credit_samples(task: Task, samples: Samples, per_sample: Sequence[float]) -> Group:
    """A group whose every rollout carries its sample's scalar credit on its trainable tokens
    (an episode's segments share the episode's credit)."""
    rollouts = tuple(dataclasses.replace(r, advantages=broadcast(r, a))
                     for sample, a in zip(samples, per_sample, strict=True) for r in sample)
    return Group(task, rollouts)


def final_rewards(samples: Samples) -> list[float]:
    """One reward per sample: the episode's (its last segment's)."""
    return [float(sample[-1].reward) for sample in samples]  # type: ignore[arg-type]


def checked_stream(values: Any, r: Rollout, what: str, where: str) -> tuple[float, ...]:
    """``values`` as a tuple of finite floats, one per completion token of ``r``; an error naming
    ``where`` (the row and rollout) and ``what`` otherwise: a stream is never trimmed or padded."""
    try:
        out = tuple(float(v) for v in values)
    except (TypeError, ValueError):
        raise RLLoopError(f"{where}: {what} must be a sequence of numbers, got {values!r:.120}") from None
    if len(out) != len(r.completion_ids):
        raise RLLoopError(f"{where}: {what} has {len(out)} values for {len(r.completion_ids)} completion tokens")
    bad = next((i for i, v in enumerate(out) if not math.isfinite(v)), None)
    if bad is not None:
        raise RLLoopError(f"{where}: {what}[{bad}] = {out[bad]} is not finite")
    return out
