"""Hybrid shard (HSDP, ``[train] shard = "fsdp"``, ``shard_size = S``): FSDP2 over a 2-D mesh.

What it is: :class:`HybridShardTrainer`, a :class:`~rlvr.backends.train.sharded.ShardedTrainer` whose
ranks form a ``(replicate, shard)`` device mesh, ``replicate = world_size / S``: the policy is sharded
over each group of ``S`` consecutive ranks (ranks ``r`` with the same ``r // S``; on GPUs, one node's)
and every such group holds a whole copy of it. FSDP2's ``fully_shard`` on a 2-D mesh does this
itself: within a group the weights are all-gathered and the gradients reduce-scattered as under
plain sharding, and the gradient shards are then all-reduced across the groups, so the traffic that
crosses nodes is one all-reduce of a ``1 / S`` shard per optimizer step instead of per-layer
all-gathers over every rank. Each rank holds ``1 / S`` of the weights, gradients and AdamW state
(not ``1 / world_size``): memory traded for bandwidth.

Invariants:

- The gradient is the one-process gradient: every rank trains its own share of each minibatch (as
  under plain sharding: ``world_size`` shares), each loss component is divided by its count over the
  whole minibatch, and both reductions **sum** (divide factor 1, set on every FSDP module).
- The mesh is made and the weights sharded when every rank hands out rank 0's weights
  (:meth:`broadcast_weights`): making the sub-groups is a collective, and rank 0 builds its trainer
  before the other ranks are told to build theirs. The optimizer is then remade over the sharded
  parameters.
- Gathering, checkpoints in both layouts and loading are FSDP's and DCP's, which read 2-D meshes,
  so a hybrid-shard checkpoint resumes on any layout and the reverse.

Refused, naming ``train.shard_size``: a size that does not divide the number of ranks.

A backend module: imports torch; never branches on the algorithm.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

from rlvr.backends.model.policy import Policy
from rlvr.backends.train.sharded import ShardedTrainer, shard_module
from rlvr.errors import BackendError


class HybridShardTrainer(ShardedTrainer):
    """One rank of a ``(replicate, shard)`` trainer (the process group must be started); see the module docstring."""

    shard = "hsdp"

    def __init__(self, policy: Policy, *, shard_size: int, **kwargs: Any):
        world = dist.get_world_size()
        if shard_size < 1 or world % shard_size:
            raise BackendError(f"train.shard_size = {shard_size} must divide the number of trainer ranks ({world})")
        self.shard_size, self.replicas = shard_size, world // shard_size
        self.strategy = (f"hybrid shard (HSDP) on a 2-D mesh replicate={self.replicas} x shard={shard_size}: FSDP2 "
                         "within each group, gradient shards all-reduced across groups, sums, global loss "
                         "normalisation")
        self.mesh: Any = None
        self._unsharded: list[torch.nn.Module] = []
        super().__init__(policy, **kwargs)

    def _shard(self, model: torch.nn.Module) -> None:
        self._unsharded.append(model)  # sharded at broadcast_weights, with every rank (see the module docstring)

    def _make_mesh(self) -> None:
        device = "cuda" if str(self.policy.device).startswith("cuda") else "cpu"
        self.mesh = init_device_mesh(device, (self.replicas, self.shard_size), mesh_dim_names=("replicate", "shard"))
        for model in self._unsharded:
            shard_module(model, self.mesh)  # a 2-D mesh: FSDP2 shards over dim 1, replicates over dim 0
        self._unsharded = []
        self.optimizer = torch.optim.AdamW(self.policy.trainable_parameters(), lr=self.lr,
                                           weight_decay=self.optimizer.defaults["weight_decay"])

    def broadcast_weights(self) -> None:
        """Every rank, once, before anything else: the mesh made and the weights sharded, then rank 0's
        weights into every rank's shards."""
        if self.mesh is None:
            self._make_mesh()
        super().broadcast_weights()

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "mesh": {"replicate": self.replicas, "shard": self.shard_size}}
