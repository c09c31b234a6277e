"""Tensor parallelism beside FSDP2 (``[train] shard = "fsdp"``, ``tensor_parallel = T``): a 2-D mesh.

What it is: :class:`TensorParallelTrainer`, a :class:`~rlvr.backends.train.sharded.ShardedTrainer` whose
ranks form a ``(dp, tp)`` device mesh (``dp = world_size / T``; rank ``r`` is data share ``r // T``,
tensor slice ``r % T``). Each decoder layer's linear layers are first split over the ``tp`` ranks with
DTensor's ``parallelize_module``, following the model's own tensor-parallel plan (transformers'
``base_model_tp_plan``: Megatron's pattern, q/k/v and gate/up column-wise, o and down row-wise, so the
attention heads and the MLP's inner width are split and the activations between a column-wise and a
row-wise layer stay split); then FSDP2 shards each layer over the ``dp`` ranks, as ``shard = "fsdp"``
alone does. Embeddings, norms and the output head are not split over ``tp``, whatever the model's
plan says of them (FSDP shards them over ``dp``). With LoRA (peft), a split layer's adapter is split
with it: a column-wise layer's ``B`` column-wise (``A`` whole: its input is whole, and DTensor
all-reduces the gradient that reaches it), a row-wise layer's ``A`` row-wise (``B`` whole: its input
is the all-reduced output).

Invariants:

- The gradient is the one-process gradient: the tensor slices' collectives live inside each split
  layer (DTensor), FSDP sums over ``dp`` (divide factor 1), and each loss component is divided by its
  count over the whole minibatch. A minibatch is cut into ``dp`` shares; the ``tp`` ranks of a share
  train the same rollouts, so the loss metrics are summed over the ``dp`` group only.
- The gradient norm is over every parameter, whatever mesh it lives on (the split layers' on the 2-D
  mesh, the rest on ``dp``): each mesh's norm is computed and completed (``full_tensor``), the parts
  combined, and each group clipped by the total. AdamW runs tensor by tensor (``foreach`` off): one
  fused update cannot mix two meshes.
- Gathering for a publish, checkpoints and loading are FSDP's (``get_model_state_dict`` /
  ``set_model_state_dict`` work on 2-D DTensors), so a checkpoint resumes on any layout.

Refused, naming ``train.tensor_parallel``: a world size that is not a multiple of ``T``; attention heads,
key-value heads or the MLP width not divisible by ``T``; a model whose plan needs another style than
column- and row-wise (Qwen3's per-head norms, whose gradients would need an all-reduce over ``tp``).

A backend module: imports torch and peft; never branches on the algorithm.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

from rlvr.backends.model.policy import Policy
from rlvr.backends.train.distributed import rank_share, sum_over_ranks
from rlvr.backends.train.sharded import ShardedTrainer, shard_module
from rlvr.errors import BackendError
from rlvr.types import Rollout

STYLES = {"colwise": ColwiseParallel, "rowwise": RowwiseParallel}
LAYER_PREFIX = "layers.*."


def layer_styles(model: torch.nn.Module) -> dict[str, str]:
    """``{"self_attn.q_proj": "colwise", ...}``: the model's tensor-parallel plan for one decoder layer."""
    config = getattr(model, "config", None)
    plan = dict(getattr(config, "base_model_tp_plan", None) or {})
    name = type(config).__name__ if config is not None else type(model).__name__
    if not plan:
        raise BackendError(f"train.tensor_parallel: {name} declares no tensor-parallel plan (base_model_tp_plan); "
                           "set train.tensor_parallel = 1")
    styles = {}
    for path, style in plan.items():
        if not path.startswith(LAYER_PREFIX):
            # Outside the decoder layers nothing is split, whatever the plan offers (some transformers
            # releases list embed_tokens as embedding_rowwise): a whole module fed whole inputs already
            # has the one-process gradient on every tensor slice.
            continue
        if style not in STYLES:
            raise BackendError(f"train.tensor_parallel: {name} splits {path!r} as {style!r}, which rlvr does not "
                               "apply (only column- and row-wise linear layers); set train.tensor_parallel = 1")
        styles[path[len(LAYER_PREFIX):]] = style
    return styles


def check_divisible(model: torch.nn.Module, tp: int) -> None:
    config: Any = model.config  # a transformers config
    sizes = {"num_attention_heads": config.num_attention_heads,
             "num_key_value_heads": getattr(config, "num_key_value_heads", None) or config.num_attention_heads,
             "intermediate_size": config.intermediate_size}
    bad = {k: v for k, v in sizes.items() if v % tp}
    if bad:
        raise BackendError(f"train.tensor_parallel = {tp}: the model's {bad} is not divisible by it; pick a "
                           "tensor_parallel that divides the heads, key-value heads and MLP width")


def layer_plan(layer: torch.nn.Module, styles: dict[str, str]) -> dict[str, Any]:
    """What ``parallelize_module`` gets for one decoder layer (a LoRA-wrapped linear split with its adapter)."""
    plan: dict[str, Any] = {}
    for path, style in styles.items():
        module = layer.get_submodule(path)
        cls = STYLES[style]
        if hasattr(module, "base_layer") and hasattr(module, "lora_A"):  # peft's LoRA wrapper
            plan[f"{path}.base_layer"] = cls()
            split = "lora_B" if style == "colwise" else "lora_A"
            for adapter in getattr(module, split):
                plan[f"{path}.{split}.{adapter}"] = cls()
        else:
            plan[path] = cls()
    return plan


class TensorParallelTrainer(ShardedTrainer):
    """One rank of a ``(dp, tp)`` trainer (the process group must be started); see the module docstring."""

    shard = "fsdp+tp"

    def __init__(self, policy: Policy, *, tensor_parallel: int, **kwargs: Any):
        world = dist.get_world_size()
        if tensor_parallel < 2 or world % tensor_parallel:
            raise BackendError(f"train.tensor_parallel = {tensor_parallel} must be >= 2 and divide the number of "
                               f"trainer ranks ({world})")
        if kwargs.get("offload", "none") != "none":  # FSDP2's CPU offload over a 2-D mesh is not tested here
            raise BackendError(f"train.offload = {kwargs['offload']!r} with train.tensor_parallel = {tensor_parallel}: "
                               "offload runs with FSDP2 alone (tensor_parallel = 1)")
        self.tp, self.dp = tensor_parallel, world // tensor_parallel
        self.styles = layer_styles(policy.model)
        check_divisible(policy.model, self.tp)
        self.strategy = (f"2-D mesh dp={self.dp} x tp={self.tp}: decoder linears split over tp (DTensor, column- then "
                         "row-wise), FSDP2 over dp, gradients sum-reduced, global loss normalisation")
        self.mesh: Any = None
        self._unsplit: list[torch.nn.Module] = []
        super().__init__(policy, **kwargs)

    def _shard(self, model: torch.nn.Module) -> None:
        # Making the mesh and splitting the weights are collectives, and rank 0 builds its trainer before
        # the other ranks are told to build theirs: both wait for broadcast_weights, which every rank runs.
        self._unsplit.append(model)

    def _split(self) -> None:
        device = "cuda" if str(self.policy.device).startswith("cuda") else "cpu"
        self.mesh = init_device_mesh(device, (self.dp, self.tp), mesh_dim_names=("dp", "tp"))
        for model in self._unsplit:
            shard_module(model, self.mesh["dp"], before=lambda layer: parallelize_module(
                layer, self.mesh["tp"], layer_plan(layer, self.styles)))
        self._unsplit = []
        # The parameters are new (DTensors) and live on two meshes: AdamW over them, tensor by tensor.
        self.optimizer = torch.optim.AdamW(self.policy.trainable_parameters(), lr=self.lr,
                                           weight_decay=self.optimizer.defaults["weight_decay"], foreach=False)

    def broadcast_weights(self) -> None:
        """Every rank, once, before anything else: the mesh made, the weights split and sharded, then
        rank 0's weights into every rank's slices."""
        if self.mesh is None:
            self._split()
        super().broadcast_weights()

    def _data_ranks(self) -> int:
        return self.dp

    def _share(self, rollouts: Sequence[Rollout]) -> Sequence[Rollout]:
        return rollouts[rank_share(len(rollouts), self.mesh["dp"].get_local_rank(), self.dp)]

    def _reduce(self, totals: dict[str, float]) -> dict[str, float]:
        return sum_over_ranks(totals, group=self.mesh["dp"].get_group())  # tp ranks hold copies of a share's

    def _clip(self) -> torch.Tensor:
        """The norm over every gradient, one mesh at a time, completed and combined; then clip each group."""
        groups: dict[Any, list[torch.Tensor]] = {}
        for p in self.policy.trainable_parameters():
            if p.grad is not None:
                mesh = p.grad.device_mesh if isinstance(p.grad, DTensor) else None
                groups.setdefault(None if mesh is None else (mesh.mesh_dim_names, tuple(mesh.mesh.flatten().tolist())),
                                  []).append(p)
        parts = []
        for params in groups.values():
            norm = torch.nn.utils.get_total_norm([p.grad for p in params if p.grad is not None], 2.0)  # all have one
            parts.append(norm.full_tensor() if isinstance(norm, DTensor) else norm)
        total = torch.linalg.vector_norm(torch.stack(parts), 2.0)
        for params in groups.values():
            torch.nn.utils.clip_grads_with_norm_(params, self.max_grad_norm, total, foreach=False)
        return total

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "mesh": {"dp": self.dp, "tp": self.tp}}
