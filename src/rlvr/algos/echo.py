"""``echo``: GRPO on the sampled tokens, plus ``ce`` on the tokens the environment added
(tool results, user replies), each at the weight its message role has in ``algo.roles``.

Learning to predict the environment's answers is a cheap auxiliary signal in multi-turn tasks
(ECHO). The default table trains tool results at 0.1 and nothing else; setting ``roles`` replaces
the whole table. Roles come from the episode (:attr:`rlvr.types.Rollout.token_roles`, set by
multi-turn rollouts); a single-turn rollout has no environment tokens and trains as ``grpo``.

**The filter hook** (``algo.import_path`` + ``algo.kwargs``) narrows that selection per sample:
``fn(segments, **kwargs) -> list[list[bool]]`` is called once per sample with its segments (the
episode's :class:`~rlvr.types.Rollout` s, one per turn, in order; a single-turn sample is one) and
returns one keep-mask per segment, aligned with that segment's ``completion_ids``. A token whose
mask is ``False`` leaves the ``ce`` component (its weight becomes 0); ``True`` keeps the role's
weight. The rl tokens are never touched. A return of the wrong shape, or an entry that is not a
bool, stops the run naming the row, the sample and the segment: a mask is never trimmed or padded.
Components: ``rl`` + ``ce``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

from rlvr.algos.base import Samples
from rlvr.algos.grpo import GRPO
from rlvr.errors import RLLoopError
from rlvr.types import Group, Rollout, Task

DEFAULT_ROLES = {"tool": 0.1}
Filter = Callable[..., Any]


class Echo(GRPO):
    name: ClassVar[str] = "echo"
    components: ClassVar[tuple[str, ...]] = ("rl", "ce")

    def __init__(self, advantage: str = "grpo", roles: dict[str, float] | None = None,
                 token_filter: Filter | None = None, import_path: str | None = None,
                 kwargs: dict[str, Any] | None = None):
        super().__init__(advantage)
        self.roles = dict(DEFAULT_ROLES if roles is None else roles)
        bad = {k: v for k, v in self.roles.items() if not (isinstance(v, (int, float)) and v >= 0)}
        if bad:
            raise ValueError(f"algo.roles: weights must be numbers >= 0, got {bad}")
        self.token_filter, self.import_path, self.kwargs = token_filter, import_path, dict(kwargs or {})

    def assign(self, task: Task, samples: Samples) -> Group:
        group = super().assign(task, samples)
        keeps = self.kept_tokens(task, samples)
        return Group(task, tuple(dataclasses.replace(r, ce_weights=self.observation_weights(r, keep))
                                 for r, keep in zip(group.rollouts, keeps, strict=True)))

    def observation_weights(self, r: Rollout, keep: Sequence[bool] | None = None) -> tuple[float, ...] | None:
        if r.token_roles is None:
            return None
        keep = keep if keep is not None else (True,) * len(r.completion_ids)
        weights = tuple(0.0 if m or not k else float(self.roles.get(role, 0.0))
                        for m, role, k in zip(r.mask, r.token_roles, keep, strict=True))
        return weights if any(weights) else None

    def kept_tokens(self, task: Task, samples: Samples) -> list[tuple[bool, ...] | None]:
        """The filter's keep-mask of every rollout of the group, in the group's order (``None``:
        no filter, every token kept)."""
        if self.token_filter is None:
            return [None for sample in samples for _ in sample]
        out: list[tuple[bool, ...] | None] = []
        for i, sample in enumerate(samples):
            where = f"row {task.id!r} sample {i}: algo.import_path {self.import_path!r}"
            masks = self.token_filter(tuple(sample), **self.kwargs)
            if not isinstance(masks, (list, tuple)) or len(masks) != len(sample):
                raise RLLoopError(f"{where} must return one keep-mask per segment ({len(sample)}), "
                                  f"got {masks!r:.120}")
            out += [checked_mask(mask, r, f"{where}, segment {j}") for j, (mask, r) in enumerate(zip(masks, sample,
                                                                                               strict=True))]
        return out

    def describe(self) -> dict[str, Any]:
        described = {**super().describe(), "roles": self.roles}
        if self.token_filter is not None:
            described["kwargs"] = self.kwargs  # the filter is import_path, in the base's description
        return described


def checked_mask(mask: Any, r: Rollout, where: str) -> tuple[bool, ...]:
    """``mask`` as a tuple of bools, one per completion token of ``r``; an error naming ``where`` otherwise."""
    if not isinstance(mask, (list, tuple)):
        raise RLLoopError(f"{where}: a keep-mask must be a list of bools, got {mask!r:.120}")
    if len(mask) != len(r.completion_ids):
        raise RLLoopError(f"{where}: the keep-mask has {len(mask)} entries for {len(r.completion_ids)} "
                          "completion tokens")
    bad = next((k for k, v in enumerate(mask) if not isinstance(v, bool)), None)
    if bad is not None:
        raise RLLoopError(f"{where}: keep-mask[{bad}] = {mask[bad]!r} is not a bool")
    return tuple(mask)
