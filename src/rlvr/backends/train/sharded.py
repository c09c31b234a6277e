"""Sharded trainer ranks (``[train] shard = "fsdp"``): the policy split over the ranks with FSDP2.

What it is: :class:`ShardedTrainer`, a :class:`~rlvr.backends.train.distributed.RankTrainer` whose
policy is cut with ``torch.distributed.fsdp.fully_shard`` (each decoder layer, then the root; the
frozen full-fine-tune reference for KL too, when it lives on the policy's device), so each rank
holds ``1 / world_size`` of the weights, gradients and AdamW state. It plugs into the same command
loop (:class:`~rlvr.backends.train.distributed.DistributedTrainer` on rank 0,
:func:`~rlvr.backends.train.distributed.serve_rank` on the others); full fine-tune and LoRA (peft)
both run on gloo (CPU) and NCCL (GPU).

Invariants:

- Every forward and backward of a sharded module is a collective, so every rank runs the same
  passes: a rank with fewer rollouts than rank 0 in a minibatch (or none) runs filler passes on
  the minibatch's first rollout with its loss scaled by 0, which add nothing to any gradient.
- Normalisation is global, as with replicated weights: each loss component is divided by its count
  over the whole minibatch, and FSDP's reduce-scatter **sums** the gradients (divide factor 1, a
  plain SUM, which gloo supports) instead of averaging them, so the summed gradient is the one-rank
  gradient. ``clip_grad_norm_`` over the DTensor gradients returns the global norm (the same float
  on every rank), and the non-finite decision is reduced as before.
- Full weights exist only when asked for, and only on rank 0: :meth:`ShardedTrainer.gather` (a
  collective every rank joins) copies the trainable weights, gathered with
  ``get_model_state_dict(full_state_dict=True, cpu_offload=True)``, into rank 0's unsharded CPU
  copy of the policy (:class:`GatheredPolicy`), which the weight-sync lanes write from. That copy
  costs rank 0 one full model in host memory.
- Checkpoints keep the one layout every trainer writes (adapter or full weights, an optimizer
  ``state_dict`` numbered in trainable-parameter order, ``trainer.json``): the weights and the
  optimizer state are gathered collectively and only rank 0 writes, so a run resumes on any number
  of ranks, sharded or not. Loading reads the folder on rank 0 only and broadcasts from there
  (``set_model_state_dict`` / ``set_optimizer_state_dict`` with ``broadcast_from_rank0``). With
  ``checkpoint_layout = "sharded"`` nothing is gathered: every rank writes and reads its own shards
  through ``torch.distributed.checkpoint`` (:mod:`~rlvr.backends.train.checkpoint_io`), and a load
  is followed by a gather so rank 0's copy holds the loaded weights.
- With ``micro_batch_tokens`` the ranks' shares may cut into different numbers of micro-batches:
  every rank cuts every share the same way and runs as many passes as the most of them.

A backend module: imports torch and peft; never branches on the algorithm.
"""

from __future__ import annotations

import copy
import dataclasses
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from peft import PeftModel
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.fsdp import FSDPModule, fully_shard

from rlvr.backends.model.policy import Policy
from rlvr.backends.train.checkpoint_io import (
    is_sharded_checkpoint,
    load_sharded,
    read_weights,
    save_sharded,
    write_checkpoint,
)
from rlvr.backends.train.chunk import Chunk
from rlvr.backends.train.distributed import RankTrainer, rank_share, sum_over_ranks
from rlvr.backends.train.offload import fsdp_offload_policy
from rlvr.backends.train.trainer import pack
from rlvr.errors import BackendError
from rlvr.types import Rollout

GATHER = StateDictOptions(full_state_dict=True, cpu_offload=True)  # to rank 0's host memory; others get {}
GATHER_TRAINABLE = StateDictOptions(full_state_dict=True, cpu_offload=True, ignore_frozen_params=True)
BROADCAST = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True, strict=False)


def decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The blocks each sharded on their own: the classes the model names in ``_no_split_modules``
    (transformers' own list of blocks that must stay whole; peft forwards the attribute)."""
    names = set(getattr(model, "_no_split_modules", None) or ())
    return [m for m in model.modules() if type(m).__name__ in names]


def shard_module(model: torch.nn.Module, mesh: Any = None, before: Any = None, offload: str = "none") -> None:
    """``fully_shard`` each decoder layer, then the root, over ``mesh`` (default: every rank); gradients
    summed over ranks, not averaged. ``before(layer)`` runs on each layer first (tensor parallelism);
    ``offload = "params"`` keeps the shards in host memory (:mod:`~rlvr.backends.train.offload`)."""
    layers = decoder_layers(model)
    if not layers:
        raise BackendError(f"train.shard = 'fsdp': {type(model).__name__} names no decoder layer class "
                           "(_no_split_modules), so it cannot be sharded per layer; use train.shard = 'replicate'")
    for layer in layers:
        if before is not None:
            before(layer)
        fully_shard(layer, mesh=mesh, offload_policy=fsdp_offload_policy(offload))
    fully_shard(model, mesh=mesh, offload_policy=fsdp_offload_policy(offload))
    for module in model.modules():
        if isinstance(module, FSDPModule):  # each FSDP module reduces its own parameters
            module.set_gradient_divide_factor(1.0)
            module.set_force_sum_reduction_for_comms(True)


class GatheredPolicy:
    """Rank 0's full, unsharded CPU copy of a sharded policy, as the weight-sync lanes see a policy:
    the copy's ``model``, the live policy's tokenizer, base and version. Its weights are those of the
    last :meth:`ShardedTrainer.gather`."""

    def __init__(self, live: Policy):
        self.live = live
        self.model = copy.deepcopy(live.model).to("cpu").eval()
        self.model.requires_grad_(False)
        self.trainable_names = [n for n, p in live.model.named_parameters() if p.requires_grad]
        self.base, self.tokenizer, self.lora, self.device = live.base, live.tokenizer, live.lora, "cpu"

    @property
    def version(self) -> int:
        return self.live.version

    @property
    def is_lora(self) -> bool:
        return isinstance(self.model, PeftModel)

    @property
    def eos_ids(self) -> set[int]:
        return self.live.eos_ids

    def trainable(self) -> dict[str, Any]:  # tensors (typed as torch.distributed's state dicts take them)
        """The copy's weights under the live policy's trainable names (what a gather fills)."""
        params = dict(self.model.named_parameters())
        return {name: params[name].detach() for name in self.trainable_names}

    def fill(self, weights: dict[str, Any]) -> None:  # name -> tensor, as a gather returns them
        missing = sorted(set(self.trainable_names) - set(weights))
        unexpected = sorted(set(weights) - set(dict(self.model.named_parameters())) - set(self.model.state_dict()))
        if missing or unexpected:
            raise BackendError(f"gathered weights do not fit the policy: missing {missing[:3]}, unexpected "
                               f"{unexpected[:3]}; report this")
        self.model.load_state_dict(weights, strict=False)  # in place: lanes keep pointing at these tensors


class ShardedTrainer(RankTrainer):
    """One rank of an FSDP2-sharded trainer (the process group must be started). Shards ``policy``
    in place; on rank 0 keeps the unsharded copy the lanes and checkpoints are written from."""

    shard = "fsdp"
    strategy = "FSDP2 (fully_shard per decoder layer), gradients sum-reduce-scattered, global loss normalisation"

    def __init__(self, policy: Policy, offload: str = "none", **kwargs: Any):
        self.offload = offload  # "params": FSDP2's CPU offload of the shards (backends/train/offload.py)
        # Taken before sharding: rank 0's weights as built (an adapter_init included) are what every rank starts from.
        self.full = GatheredPolicy(policy) if dist.get_rank() == 0 else None
        self._shard(policy.model)
        reference = policy.reference
        if reference is not None and next(reference.parameters()).device == next(policy.model.parameters()).device:
            self._shard(reference)  # on another device (reference_on_cpu) it stays whole: its forward is local
        super().__init__(policy, offload=offload, **kwargs)  # the optimizer over the sharded (DTensor) parameters
        # Every rank must issue the same all-gathers: a rank whose share repeats a prompt would run
        # two forwards (shared_prefix.py) where a rank whose share does not runs one.
        self.share_prompts = False

    def _shard(self, model: torch.nn.Module) -> None:
        shard_module(model, offload=self.offload)

    def _data_ranks(self) -> int:
        """How many shares a minibatch is cut into (every rank's, here)."""
        return dist.get_world_size()

    # ---- training: the same passes on every rank; FSDP reduces the gradients ---------------------
    def _even_out(self, chunks: list[Chunk], read: Sequence[Rollout]) -> list[Chunk]:
        shares = self._data_ranks()  # every rank cuts every share: the most micro-batches any rank runs
        most = max(len(self._cut(read[rank_share(len(read), r, shares)])) for r in range(shares))
        if len(chunks) < most:
            filler = Chunk(pack(read[:1], self.policy.tokenizer.pad_token_id, self.policy.device),
                           {"rl": 1.0, "ce": 1.0, "ref_kl": 1.0}, 0.0, filler=True)
            chunks += [dataclasses.replace(filler) for _ in range(most - len(chunks))]
        return chunks

    def _reduce(self, totals: dict[str, float]) -> dict[str, float]:
        return sum_over_ranks(totals)  # the gradients were reduce-scattered by FSDP in each backward

    def broadcast_weights(self) -> None:
        """Rank 0's weights as built (its unsharded copy) into every rank's shards."""
        weights = self.full.trainable() if self.full is not None else {}
        set_model_state_dict(self.policy.model, weights, options=BROADCAST)

    # ---- full weights on rank 0 --------------------------------------------------------------
    def gather(self) -> GatheredPolicy | None:
        """Every rank: the trainable weights gathered into rank 0's unsharded copy, which is returned
        there (``None`` on the other ranks)."""
        weights = get_model_state_dict(self.policy.model, options=GATHER_TRAINABLE)
        if self.full is None:
            return None
        self.full.fill(weights)
        return self.full

    def checkpoint(self, path: str) -> None:
        """Every rank: weights and optimizer state gathered, rank 0 writing them in the common layout; or,
        with ``checkpoint_layout = "sharded"``, every rank writing its own shards (checkpoint_io.py)."""
        if self.checkpoint_layout == "sharded":
            save_sharded(Path(path), self.policy.model, self.optimizer, self.state())
            return
        self.gather()
        state = get_optimizer_state_dict(self.policy.model, self.optimizer, options=GATHER)
        if self.full is not None:
            write_checkpoint(Path(path), self.full.model, _numbered(state, self.full.trainable_names), self.state())

    def save(self, path: str) -> None:
        self.checkpoint(path)

    def load(self, path: str) -> None:
        """Every rank: rank 0 reads the checkpoint and broadcasts weights, optimizer state and counters; a
        sharded checkpoint (of any number of ranks) is read by every rank, resharded by DCP."""
        if is_sharded_checkpoint(Path(path)):
            self.restore(load_sharded(Path(path), self.policy.model, self.optimizer))
            self.gather()  # rank 0's unsharded copy holds the loaded weights, as after a gathered load
            return
        weights: dict[str, Any] = {}
        optimizer: dict[str, Any] = {}
        box: list[Any] = [None]
        if self.full is not None:
            root = Path(path)
            read_weights(root, self.full.model)
            weights = self.full.trainable()
            numbered = torch.load(root / "optimizer.pt", weights_only=True)
            optimizer = _named(numbered, self.full.trainable_names, path)
            box = [json.loads((root / "trainer.json").read_text())]
        set_model_state_dict(self.policy.model, weights, options=BROADCAST)
        set_optimizer_state_dict(self.policy.model, self.optimizer, optimizer,
                                 options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True))
        dist.broadcast_object_list(box, src=0)
        self.restore(box[0])


def _numbered(state: dict[str, Any], names: list[str]) -> dict[str, Any]:
    """A full optimizer state keyed by parameter name, as ``Optimizer.state_dict()`` numbers it."""
    index = {name: i for i, name in enumerate(names)}
    unknown = sorted(set(state["state"]) - set(index))
    if unknown:
        raise BackendError(f"optimizer state names parameters the policy does not train: {unknown[:3]}; report this")
    groups = [{**g, "params": [index[n] for n in g["params"]]} for g in state["param_groups"]]
    return {"state": {index[n]: s for n, s in state["state"].items()}, "param_groups": groups}


def _named(state: dict[str, Any], names: list[str], path: str) -> dict[str, Any]:
    """``Optimizer.state_dict()`` numbering back to parameter names; a checkpoint of another model is refused."""
    count = sum(len(g["params"]) for g in state["param_groups"])
    if count != len(names):
        raise BackendError(f"{path}/optimizer.pt holds state for {count} parameters but the policy trains "
                           f"{len(names)}: the checkpoint is of another model or LoRA setting")
    groups = [{**g, "params": [names[i] for i in g["params"]]} for g in state["param_groups"]]
    return {"state": {names[i]: s for i, s in state["state"].items()}, "param_groups": groups}
