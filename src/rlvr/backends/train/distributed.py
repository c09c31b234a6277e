"""Data-parallel training over ``torch.distributed``: every rank trains its share of each batch.

What it is: :class:`RankTrainer`, a :class:`~rlvr.backends.train.trainer.TorchTrainer` that trains
one rank's share of every minibatch and sum-reduces the gradients; :class:`DistributedTrainer`, the
trainer seam on rank 0, which hands each command to the other ranks (``broadcast_object_list``)
before running it itself; and :func:`serve_rank`, the small loop the other ranks run (``init``,
``train``, ``load``, ``save``, ``gather``, ``stop``). The loop and the rest of rlvr see one trainer and no ranks.

Invariants:

- The split is by rollout and deterministic: the PPO minibatches are cut from the whole batch as on
  one process, and each minibatch is cut into ``world_size`` contiguous shares (the first
  ``n % world_size`` one rollout longer; a rank may get none and still takes part in every reduce).
- Normalisation is global: every loss component is divided by its count over the whole minibatch
  (all ranks, ``LossInputs.denominators``), and gradients are **summed** over ranks (not averaged as
  DDP does, so no ``dp_size`` factor is needed): the summed gradient is the one-rank gradient, up to
  float rounding. The pre-clip norm, the loss metrics and the non-finite decision are reduced too,
  so every rank clips by the same norm and skips or applies the same steps.
- Replicated (``shard = "replicate"``): weights and optimizer state stay bitwise identical on every rank: the same
  reduced gradient goes through the same optimizer. ``save`` checks it (a digest per rank) and only
  rank 0 writes, in :class:`TorchTrainer`'s own layout, so a checkpoint resumes on any number of
  ranks (every rank loads it; the folder must be reachable by all, as on one node).

The sharding is chosen per run (``[train] shard``):

- ``"replicate"`` (the default; this module): replicated weights with one flat gradient all-reduce
  per optimizer step. It is the mode for sampling in-process: rank 0 samples and scores held-out
  rows from the very same policy on its own (the in-process engine), which needs the whole policy
  in one process. Each rank holds the whole model and optimizer state, so N ranks buy speed, not
  memory. DDP's wrapper is not used: it would average gradients (the ``dp_size`` factor) and sync
  at every micro-batch's backward; one flat all-reduce per optimizer step does exactly what is needed.
- ``"fsdp"`` (:mod:`rlvr.backends.train.sharded`): the policy sharded with FSDP2, so each rank
  holds a ``1 / world_size`` share of weights, gradients and optimizer state. A sharded forward
  needs every rank, so nothing runs the policy on rank 0 alone: sampling and held-out run on
  servers (the in-process engine is refused), and publishing and checkpoints gather the full
  weights in a collective (the ``gather`` and ``save`` commands) that every rank joins.

gloo on CPU, NCCL on GPU, in both modes.

A backend module: imports torch; never branches on the algorithm.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from rlvr.backends.train.trainer import TorchTrainer
from rlvr.errors import BackendError
from rlvr.lr_schedule import LRSchedule
from rlvr.types import Batch, Rollout

# Worker ranks wait in a broadcast while rank 0 warm-starts, samples and evaluates: a collective's
# timeout must outlast the longest of those, not just a train step.
IDLE_TIMEOUT = timedelta(hours=24)


@dataclass(frozen=True, slots=True)
class Ranks:
    """This process's place in the group (from torchrun's ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``)."""

    rank: int
    world_size: int
    local_rank: int
    backend: str


def ranks_from_env(env: dict[str, str] | None = None) -> Ranks | None:
    """The group torchrun (or any launcher setting its variables) started this process in; ``None``
    outside one or in a group of one. The backend is not known yet: :func:`start_ranks` picks it."""
    env = dict(os.environ) if env is None else env
    try:
        world = int(env.get("WORLD_SIZE", "1"))
        rank, local = int(env.get("RANK", "0")), int(env.get("LOCAL_RANK", env.get("RANK", "0")))
    except ValueError as exc:
        raise BackendError(f"torchrun's RANK/WORLD_SIZE/LOCAL_RANK are not integers ({exc})") from None
    return Ranks(rank, world, local, "") if world > 1 else None


def current_ranks() -> Ranks | None:
    """The data-parallel group this process has joined (:func:`start_ranks`); ``None`` outside one."""
    if not dist.is_available() or not dist.is_initialized() or dist.get_world_size() < 2:
        return None
    local = int(os.environ.get("LOCAL_RANK", dist.get_rank()))
    return Ranks(dist.get_rank(), dist.get_world_size(), local, str(dist.get_backend()))


def start_ranks(ranks: Ranks, device: str) -> Ranks:
    """Join the process group: NCCL when the policy lives on a GPU, gloo on the CPU. On the CPU each
    rank gets ``cores // world_size`` torch threads, so ranks do not fight over the cores."""
    backend = "nccl" if device.startswith("cuda") else "gloo"
    if backend == "nccl":
        torch.cuda.set_device(ranks.local_rank)
    else:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
        torch.set_num_threads(max(1, cores // ranks.world_size))
    if not dist.is_initialized():
        dist.init_process_group(backend, rank=ranks.rank, world_size=ranks.world_size, timeout=IDLE_TIMEOUT)
    return Ranks(ranks.rank, ranks.world_size, ranks.local_rank, backend)


def rank_share(n: int, rank: int, world_size: int) -> slice:
    """Rank ``rank``'s contiguous share of ``n`` rollouts (the first ``n % world_size`` one longer)."""
    size, extra = divmod(n, world_size)
    start = rank * size + min(rank, extra)
    return slice(start, start + size + (1 if rank < extra else 0))


def sum_over_ranks(totals: dict[str, float], group: Any = None) -> dict[str, float]:
    """Each rank's loss parts and rl-share-weighted statistics, added up to the minibatch's (over the
    ranks of ``group``, default all)."""
    every: list[dict[str, float] | None] = [None] * dist.get_world_size(group)
    dist.all_gather_object(every, totals, group=group)
    summed: dict[str, float] = {}
    for part in every:
        for key, value in (part or {}).items():
            summed[key] = summed.get(key, 0.0) + value
    return summed


class RankTrainer(TorchTrainer):
    """One rank of a data-parallel trainer with replicated weights (the process group must be started).

    :meth:`checkpoint` and :meth:`gather` are run by every rank at once (rank 0's command);
    :class:`~rlvr.backends.train.sharded.ShardedTrainer` makes them collectives."""

    shard = "replicate"
    strategy = "replicated weights, gradients sum-reduced, global loss normalisation"

    def _share(self, rollouts: Sequence[Rollout]) -> Sequence[Rollout]:
        return rollouts[rank_share(len(rollouts), dist.get_rank(), dist.get_world_size())]

    def _reduce(self, totals: dict[str, float]) -> dict[str, float]:
        self._sum_gradients()
        return sum_over_ranks(totals)

    def _sum_gradients(self) -> None:
        """Every rank's gradients replaced by their sum over the ranks."""
        params = self.policy.trainable_parameters()
        for p in params:
            if p.grad is None:  # a rank with no rollouts in this minibatch still adds its zeros
                p.grad = torch.zeros_like(p)
        by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
        for p in params:
            grad = p.grad
            assert grad is not None  # filled above
            by_dtype.setdefault(grad.dtype, []).append(grad)
        for grads in by_dtype.values():  # one flat all-reduce per dtype: few, large messages
            flat = torch.cat([g.reshape(-1) for g in grads])
            dist.all_reduce(flat, op=dist.ReduceOp.SUM)
            for grad, summed in zip(grads, flat.split([g.numel() for g in grads]), strict=True):
                grad.copy_(summed.view_as(grad))

    def _agree_rows(self, rows: int) -> int:
        agreed = torch.tensor([rows], device=self.policy.device)
        dist.all_reduce(agreed, op=dist.ReduceOp.MIN)  # sharded ranks must run the same passes
        return int(agreed.item())

    def _agree(self, ok: bool) -> bool:
        flag = torch.tensor([1 if ok else 0], device=self.policy.device)
        dist.all_reduce(flag, op=dist.ReduceOp.MIN)  # one rank's non-finite value skips the step everywhere
        return bool(flag.item())

    def broadcast_weights(self) -> None:
        """Rank 0's trainable weights to every rank (at start: an adapter loaded on rank 0 reaches all)."""
        with torch.no_grad():
            for p in self.policy.trainable_parameters():
                dist.broadcast(p.data, src=0)
        if hasattr(self.optimizer, "resync"):  # offload = "optimizer": the host master copies follow
            self.optimizer.resync()

    def checkpoint(self, path: str) -> None:
        """Every rank: check the replicas agree; rank 0 writes the checkpoint (every rank joins a sharded
        one's collective save, which writes each replicated tensor once)."""
        _check_replicas(self)
        if dist.get_rank() == 0 or self.checkpoint_layout == "sharded":
            self.save(path)

    def gather(self) -> Any:
        """Every rank: the full policy for a weight-sync lane on rank 0 (here it is the live one)."""
        return self.policy

    def digest(self) -> list[float]:
        """A cheap fingerprint of the trainable weights and the version, to compare across ranks."""
        with torch.no_grad():
            params = self.policy.trainable_parameters()
            total = sum(float(p.double().sum()) for p in params)
            squares = sum(float(p.double().square().sum()) for p in params)
        return [float(self.policy.version), total, squares]


def _send(message: tuple[Any, ...]) -> tuple[Any, ...]:
    box: list[Any] = [message]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def _check_replicas(trainer: RankTrainer) -> None:
    every: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(every, trainer.digest())
    if any(d != every[0] for d in every):
        raise BackendError(f"data-parallel ranks hold different weights (version, sum, sum of squares per rank: "
                           f"{every}); the checkpoint would not resume on another number of ranks: report this")


class DistributedTrainer:
    """The trainer seam on rank 0 of a data-parallel group: ``(batch) -> metrics``, ``save``, ``load``.

    Each call is first sent to the other ranks (running :func:`serve_rank`), then run here; every
    rank trains its share and the gradients meet in the all-reduce. ``close`` tells them to stop."""

    def __init__(self, trainer: RankTrainer, ranks: Ranks):
        self.trainer, self.ranks, self._open = trainer, ranks, True
        _send(("init", trainer.policy.base, trainer.lr_schedule.as_dict()))  # every rank steps at rank 0's rates
        trainer.broadcast_weights()

    @property
    def version(self) -> int:
        return self.trainer.version

    @property
    def policy(self) -> Any:
        return self.trainer.policy

    def __call__(self, batch: Batch) -> dict[str, float]:
        _send(("train", batch))
        return self.trainer(batch)

    def save(self, path: str) -> None:
        _send(("save", path))
        self.trainer.checkpoint(path)

    def gather(self) -> Any:
        """The full policy at the current version, on rank 0, for publishing (a collective when sharded)."""
        _send(("gather",))
        return self.trainer.gather()

    def load(self, path: str) -> None:
        _send(("load", path))
        self.trainer.load(path)

    def close(self) -> None:
        if self._open and dist.is_initialized():
            self._open = False
            _send(("stop",))

    def describe(self) -> dict[str, Any]:
        return {**self.trainer.describe(), "type": "rlvr.backends.train.distributed.DistributedTrainer",
                "world_size": self.ranks.world_size, "backend": self.ranks.backend, "shard": self.trainer.shard,
                "strategy": self.trainer.strategy}


def serve_rank(build: Callable[[str], RankTrainer]) -> RankTrainer | None:
    """The loop of a rank other than 0: wait for rank 0's commands and run them until ``stop``.
    ``build(base)`` makes this rank's trainer on the base rank 0 names (after its warm start). Returns
    the trainer (``None`` when rank 0 stopped before building one)."""
    trainer: RankTrainer | None = None
    while True:
        command, *args = _send((None,))
        if command == "stop":
            return trainer
        if command == "init":
            trainer = build(args[0])
            trainer.lr_schedule = LRSchedule(**args[1])
            trainer.broadcast_weights()
            continue
        if trainer is None:
            raise BackendError(f"rank {dist.get_rank()}: rank 0 sent {command!r} before 'init'")
        if command == "train":
            trainer(args[0])
        elif command == "load":
            trainer.load(args[0])
        elif command == "save":
            trainer.checkpoint(args[0])
        elif command == "gather":
            trainer.gather()
        else:
            raise BackendError(f"rank {dist.get_rank()}: unknown command {command!r} from rank 0")
