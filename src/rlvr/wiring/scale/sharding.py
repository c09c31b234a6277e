"""What ``[train] shard = "fsdp"`` changes in a run's wiring: no process holds the policy whole.

Under sharded trainer ranks (:mod:`rlvr.backends.train.sharded`) everything rank 0 used to do alone
with the live policy goes elsewhere:

- sampling runs on servers (``sampler.backend = "http"`` or ``"vllm"``; the in-process engine is
  refused when the config is read, :class:`~rlvr.config.run.RunConfig`);
- weights are published from rank 0's unsharded copy, refreshed by a gather every rank joins just
  before each publish (:class:`GatheringLane`);
- held-out rows are scored through the same servers once the new version is published, and every
  held-out completion must carry the version the trainer holds (:class:`ServedVersionCheck`), so a
  held-out score is never taken on stale weights;
- checkpoints are gathered and broadcast by the trainer itself, in the common layout.

What stays as it was: the warm start and an ``adapter_init`` run on rank 0 before the policy is
sharded (every rank starts from rank 0's weights), the KL reference and the entropy bonus are
computed inside the sharded train step on every rank, and teacher scoring (``opd``/``opsd``) goes
to its endpoint or the sampler's servers. ``shard = "fsdp"`` on a single process trains unsharded
(nothing to split) but is wired the same way, so a run behaves alike on any number of ranks.
Part of the composition root.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from rlvr.errors import BackendError
from rlvr.types import SamplingParams


def is_sharded(cfg: Any) -> bool:
    return cfg.train.shard == "fsdp"


def publishing_policy(trainer: Any, policy: Any) -> Any:
    """The policy the weight-sync lanes write from: rank 0's gathered copy under sharded ranks, else
    the live policy."""
    inner = getattr(trainer, "trainer", None)  # a DistributedTrainer's own rank trainer
    full = getattr(inner, "full", None)
    return full if full is not None else policy


class GatheringLane:
    """A weight-sync lane over sharded ranks: gather the full weights into rank 0's copy (every rank
    joins), then publish them through ``lane``."""

    def __init__(self, trainer: Any, lane: Any):
        self.trainer, self.lane = trainer, lane

    def __call__(self, version: int) -> int:
        self.trainer.gather()
        return self.lane(version)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.lane, name)

    def describe(self) -> dict[str, Any]:
        inner = getattr(self.lane, "describe", None)
        return {**(inner() if inner else {}), "gathered_from": "sharded trainer ranks (FSDP2 full state dict)"}


class ServedVersionCheck:
    """The sampler's generator for held-out rows: each completion must come from the policy version the
    trainer holds (published and confirmed just before), or the evaluation fails naming both."""

    def __init__(self, generator: Any, version: Callable[[], int], *,
                 hint: str = "with train.shard = 'fsdp' held-out is scored only on published weights (keep "
                             "sampler.verify_version on)"):
        self.generator, self.version, self.hint = generator, version, hint

    async def generate(self, prompt_ids: Sequence[int], params: SamplingParams, *, seed: int) -> Any:
        out = await self.generator.generate(prompt_ids, params, seed=seed)
        expected = self.version()
        if out.version != expected:
            raise BackendError(f"held-out: the sampler answered from policy version {out.version}, but the trainer "
                               f"holds version {expected}; {self.hint}")
        return out

    def __getattr__(self, name: str) -> Any:
        return getattr(self.generator, name)

    def describe(self) -> dict[str, Any]:
        inner = getattr(self.generator, "describe", None)
        return {"type": "held-out through the run's sampler (servers or colocated engine), served version checked",
                "sampler": inner() if inner else None}


class ServedEvaluator:
    """A held-out evaluator over the servers, whose record says where it samples (the run.json entry)."""

    def __init__(self, evaluator: Any, generator: ServedVersionCheck):
        self.evaluator, self.generator = evaluator, generator

    def __call__(self, step: int, tasks: Any) -> Any:
        return self.evaluator(step, tasks)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.evaluator, name)

    def describe(self) -> dict[str, Any]:
        inner = getattr(self.evaluator, "describe", None)
        return {**(inner() if inner else {}), "sampler": self.generator.describe()}
