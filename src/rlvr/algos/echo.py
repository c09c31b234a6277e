"""``echo``: GRPO on the sampled tokens, plus ``ce`` on the tokens the environment added
(tool results, user replies), each at the weight its message role has in ``algo.roles``.

Learning to predict the environment's answers is a cheap auxiliary signal in multi-turn tasks
(ECHO). The default table trains tool results at 0.1 and nothing else; setting ``roles`` replaces
the whole table. Roles come from the episode (:attr:`rlvr.types.Rollout.token_roles`, set by
multi-turn rollouts); a single-turn rollout has no environment tokens and trains as ``grpo``.
Components: ``rl`` + ``ce``.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

from rlvr.algos.base import Samples
from rlvr.algos.grpo import GRPO
from rlvr.types import Group, Rollout, Task

DEFAULT_ROLES = {"tool": 0.1}


class Echo(GRPO):
    name: ClassVar[str] = "echo"
    components: ClassVar[tuple[str, ...]] = ("rl", "ce")

    def __init__(self, advantage: str = "grpo", roles: dict[str, float] | None = None):
        super().__init__(advantage)
        self.roles = dict(DEFAULT_ROLES if roles is None else roles)
        bad = {k: v for k, v in self.roles.items() if not (isinstance(v, (int, float)) and v >= 0)}
        if bad:
            raise ValueError(f"algo.roles: weights must be numbers >= 0, got {bad}")

    def assign(self, task: Task, samples: Samples) -> Group:
        group = super().assign(task, samples)
        return Group(task, tuple(dataclasses.replace(r, ce_weights=self.observation_weights(r))
                                 for r in group.rollouts))

    def observation_weights(self, r: Rollout) -> tuple[float, ...] | None:
        if r.token_roles is None:
            return None
        weights = tuple(0.0 if m else float(self.roles.get(role, 0.0))
                        for m, role in zip(r.mask, r.token_roles, strict=True))
        return weights if any(weights) else None

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "roles": self.roles}
