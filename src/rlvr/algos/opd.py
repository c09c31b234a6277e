"""``opd``: on-policy distillation, the reverse KL to a teacher on the policy's own samples.

Every sampled token is a ``ref_kl`` member: the trainer minimises the sampled reverse KL
``log π_θ − log π_teacher`` through the policy gradient ``sg(log π_teacher − log π_θ)·∇log π_θ``
(:func:`rlvr.backends.train.losses.ref_kl_loss`). The teacher (``algo.model``, an OpenAI-compatible
endpoint sharing the policy's tokenizer) scores each completion once, at temperature 1, when its
group is complete. No rl credit: the reward is recorded, not trained on. Components: ``ref_kl``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
from collections.abc import Callable
from typing import Any, ClassVar

from rlvr.algos.base import Algorithm, Samples, nothing, trainable
from rlvr.errors import BackendError
from rlvr.protocols import Scorer
from rlvr.types import Group, Rollout, Task


class OPD(Algorithm):
    name: ClassVar[str] = "opd"
    components: ClassVar[tuple[str, ...]] = ("ref_kl",)

    def __init__(self, scorer: Scorer, model: Any):
        self.scorer, self.model = scorer, model

    def assign(self, task: Task, samples: Samples) -> Group:
        return to_ref_kl(task, samples)

    async def score(self, group: Group) -> Group:
        return await reference_logprobs(group, self.scorer, lambda r: r.prompt_ids)

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "model": self.model}


def to_ref_kl(task: Task, samples: Samples) -> Group:
    """Every sampled token a ``ref_kl`` member, no rl credit (the routing of opd and opsd)."""
    return Group(task, tuple(dataclasses.replace(r, advantages=None, rl_weights=nothing(r), ref_kl_weights=trainable(r))
                             for sample in samples for r in sample))


async def reference_logprobs(group: Group, scorer: Scorer, prompt_of: Callable[[Rollout], Any]) -> Group:
    """Each ref_kl-bearing rollout with the reference's log-probs of its completion after
    ``prompt_of(rollout)``; a reply of the wrong length or with a non-finite value stops the run."""

    async def one(i: int, r: Rollout) -> Rollout:
        if not r.ref_kl_weights or not any(r.ref_kl_weights):
            return r
        got = list(await scorer.score(list(prompt_of(r)), list(r.completion_ids)))
        where = f"row {group.task.id!r} rollout {i}: the reference scored"
        if len(got) != len(r.completion_ids):
            raise BackendError(f"{where} {len(got)} tokens of a {len(r.completion_ids)}-token completion")
        bad = [t for t, (v, w) in enumerate(zip(got, r.ref_kl_weights, strict=True))
               if w and not (isinstance(v, (int, float)) and math.isfinite(v))]
        if bad:
            raise BackendError(f"{where} a non-finite log-prob at token {bad[0]} ({got[bad[0]]!r})")
        return dataclasses.replace(r, ref_logprobs=tuple(float(v) for v in got))

    scored = await asyncio.gather(*(one(i, r) for i, r in enumerate(group.rollouts)))
    return Group(group.task, tuple(scored))
