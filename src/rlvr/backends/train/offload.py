"""CPU offload of the trainer's state (``[train] offload``): where the weights, gradients and AdamW
moments live between the forward-backward passes.

- ``"optimizer"`` (one process, or replicated trainer ranks): :class:`HostAdamW` keeps a float32
  master copy of every trainable weight and AdamW's two moments in host memory. The device keeps the
  weights it computes with and their gradients; each optimizer step copies the gradients to the
  host, steps there, and copies the updated weights back (ZeRO-Offload's split). The device then
  holds no optimizer state: for AdamW that is two float32 numbers per trainable weight, the larger
  part of a full fine-tune's fixed memory.
- ``"params"`` (``shard = "fsdp"``): FSDP2's ``CPUOffloadPolicy`` (:func:`fsdp_offload_policy`),
  under which each rank's shards of the weights and of their gradients live in host memory, and so
  does the AdamW state over them; a layer's weights reach the device only for its forward and
  backward.

Invariants: the arithmetic is the same as without offload (AdamW on the same float32 values, in the
same order), so the updates equal the non-offloaded run's within float rounding; the optimizer's
``state_dict`` numbers the parameters in trainable-parameter order, as every checkpoint does, so a
checkpoint written with offload resumes without it and the reverse. When the policy itself is on
the CPU there is no device memory to save: the master copy is one more copy of the trainable
weights in the same memory (the config refuses ``offload`` with ``model.device = "cpu"``; this
module still runs there, which is how its arithmetic is tested on a machine without a GPU).

A backend module: imports torch.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

from rlvr.errors import BackendError

OFFLOADS = ("none", "optimizer", "params")


class HostAdamW:
    """AdamW whose master weights and moments live in host memory; the device weights are the ones the
    model computes with. The trainer uses it as a ``torch.optim.Optimizer``: ``param_groups`` (the
    learning rate per step), ``step``, ``zero_grad``, ``state``, ``state_dict`` and ``load_state_dict``."""

    def __init__(self, params: Iterable[torch.Tensor], *, lr: float, weight_decay: float, **adamw: Any):
        self.params = list(params)
        pin = torch.cuda.is_available()  # page-locked host buffers make the copies asynchronous-capable
        self.master = [p.detach().to("cpu", dtype=torch.float32, copy=True) for p in self.params]
        if pin:
            self.master = [m.pin_memory() for m in self.master]
        for m in self.master:
            m.requires_grad_(True)
        self.inner = torch.optim.AdamW(self.master, lr=lr, weight_decay=weight_decay, **adamw)

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        return self.inner.param_groups

    @property
    def state(self) -> Any:
        return self.inner.state

    @property
    def defaults(self) -> dict[str, Any]:
        return self.inner.defaults

    @torch.no_grad()
    def step(self) -> None:
        """The device gradients to the host, AdamW on the host copies, the new weights back to the device.
        A weight without a gradient (a frozen path this step) is left alone, as AdamW leaves it."""
        for p, m in zip(self.params, self.master, strict=True):
            m.grad = None if p.grad is None else p.grad.detach().to("cpu", dtype=torch.float32)
        self.inner.step()
        for p, m in zip(self.params, self.master, strict=True):
            if m.grad is not None:
                p.copy_(m)  # to the device (and its dtype); the host copy stays the float32 master
        self.inner.zero_grad(set_to_none=True)

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self.params:
            if set_to_none:
                p.grad = None
            elif p.grad is not None:
                p.grad.zero_()
        self.inner.zero_grad(set_to_none=True)

    def state_dict(self) -> dict[str, Any]:
        return self.inner.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """A checkpoint's optimizer state; the master copies are refreshed from the device weights (which
        the checkpoint's weights were loaded into first)."""
        self.inner.load_state_dict(state)
        self.resync()

    def resync(self) -> None:
        """The master copies from the device weights (after the weights were set another way: a broadcast
        from rank 0, a checkpoint)."""
        with torch.no_grad():
            for p, m in zip(self.params, self.master, strict=True):
                m.copy_(p.detach().to("cpu", dtype=torch.float32))


def adamw(params: Iterable[torch.Tensor], *, lr: float, weight_decay: float, offload: str, sharded: bool,
          **adamw_kwargs: Any) -> Any:
    """The trainer's optimizer: AdamW, with its state in host memory for ``offload = "optimizer"``.
    ``"params"`` is FSDP2's to do (the sharded parameters are already on the host, and so is AdamW over
    them); asked of an unsharded trainer it is refused naming the key."""
    if offload not in OFFLOADS:
        raise BackendError(f"train.offload must be one of {OFFLOADS}, got {offload!r}")
    if offload == "params" and not sharded:
        raise BackendError("train.offload = 'params' offloads FSDP2's shards (train.shard = 'fsdp'); an unsharded "
                           "trainer keeps its weights on the device: use train.offload = 'optimizer'")
    if offload == "optimizer" and sharded:
        raise BackendError("train.offload = 'optimizer' under train.shard = 'fsdp': FSDP2 offloads the shards of the "
                           "weights, gradients and optimizer state together; use train.offload = 'params'")
    if offload == "optimizer":
        return HostAdamW(params, lr=lr, weight_decay=weight_decay, **adamw_kwargs)
    return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay, **adamw_kwargs)


def fsdp_offload_policy(offload: str) -> Any:
    """The ``offload_policy`` for ``fully_shard``: FSDP2's CPU offload for ``"params"`` (host buffers pinned
    where a GPU is there to copy to), else none (the default, no offload)."""
    from torch.distributed.fsdp import CPUOffloadPolicy, OffloadPolicy

    if offload == "params":
        return CPUOffloadPolicy(pin_memory=torch.cuda.is_available())
    return OffloadPolicy()


def where_state_lives(trainer: Any) -> dict[str, list[str]]:
    """The devices the trainable weights, their optimizer state and (for ``HostAdamW``) its master copies
    are on: what the trainer's record and the tests read."""
    opt = trainer.optimizer
    moments = {str(t.device) for s in opt.state.values() for t in s.values() if torch.is_tensor(t) and t.dim()}
    params = {str(_local(p).device) for p in trainer.policy.trainable_parameters()}
    masters = {str(m.device) for m in getattr(opt, "master", [])}
    return {"params": sorted(params), "optimizer_state": sorted(moments), "master": sorted(masters)}


def _local(p: torch.Tensor) -> torch.Tensor:
    return p.to_local() if hasattr(p, "to_local") else p
