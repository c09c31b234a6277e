"""Sequence parallelism (``[train] sequence_parallel = P``): Ulysses-style, each of P trainer ranks
reads 1/P of every sequence.

What it is: :class:`SequenceParallelTrainer`, a replicated-weights
:class:`~rlvr.backends.train.distributed.RankTrainer` in which every rank trains every rollout of a
minibatch, but runs the model on one contiguous 1/P of each (right-padded) sequence only: the
activations of a long sequence are split over the ranks. Everything in a decoder layer but attention
works token by token, so it runs on the local positions as it is; attention needs every position,
so around it (DeepSpeed-Ulysses, Jacobs et al. 2023) one all-to-all turns the local positions of all
heads into all positions of 1/P of the heads, causal attention runs over the whole sequence for
those heads, and the reverse all-to-all gives each rank its positions back with every head. The
hook is transformers' attention interface: the model's ``attn_implementation`` becomes
``"rlvr_ulysses"`` (:func:`install`), which splits only inside :func:`split_forward` and otherwise
runs plain SDPA with the usual mask, so rank 0 still samples and evaluates with the same model.

Invariants:

- The log-probs are the one-process log-probs: each rank scores the completion tokens whose
  predicting position is local, and an all-reduce puts the [B, C] log-probs (and entropies) together
  on every rank, whose backward hands each rank the gradient of its own entries unchanged (every
  rank computes the same loss from the same log-probs, so that gradient is the same everywhere).
- The gradient is the one-process gradient: a weight's gradient is summed over its uses at every
  position, and each rank holds the part from its own positions (the all-to-alls' backward carries
  a key's and value's share from the other ranks' queries home), so the ranks' gradients are summed
  with one flat all-reduce, as under data parallelism; the loss metrics are the same on every rank
  and are not summed.
- Every rank runs every forward and backward of every layer, each split forward being a collective:
  a rank without a completion token in its slice still backpropagates (a zero-weighted anchor on its
  hidden states), and each layer's q, k and v travel in one all-to-all, so the ranks' collectives
  come in the same order.
- Refused, naming ``train.sequence_parallel``: a rank count other than P, heads or key-value heads
  P does not divide, a model without a plain body/head split, sliding-window or soft-capped
  attention, packing, ``micro_batch = "auto"`` and a left-padded batch.

A backend module: imports torch and transformers.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator, Sequence
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor

from rlvr.backends.model import precision
from rlvr.backends.model.io import PositionFeatures, completion_positions, forward_inputs, spread
from rlvr.backends.train.distributed import RankTrainer
from rlvr.backends.train.trainer import TorchTrainer
from rlvr.errors import BackendError
from rlvr.types import Rollout

ATTENTION = "rlvr_ulysses"
# The process group of the split forward running now, boxed: ``(None,)`` is the default group, ``None`` no split.
_GROUP: contextvars.ContextVar[tuple[Any] | None] = contextvars.ContextVar("rlvr_sequence_parallel", default=None)


# ---- the all-to-alls, differentiable ---------------------------------------------------------
def _positions_to_heads(x: Tensor, p: int, group: Any) -> Tensor:
    """[B, p, h, s, D] (rank r's s positions, its heads cut into p chunks) -> [B, h, p*s, D]: chunk j
    of every rank's positions to rank j, laid out in rank order (the whole sequence)."""
    B, _, h, s, D = x.shape
    send = x.permute(1, 0, 2, 3, 4).contiguous()  # [p(dest), B, h, s, D]
    recv = torch.empty_like(send)
    dist.all_to_all_single(recv, send, group=group)  # [p(src), B, h, s, D]
    return recv.permute(1, 2, 0, 3, 4).reshape(B, h, p * s, D)


def _heads_to_positions(y: Tensor, p: int, group: Any) -> Tensor:
    """[B, h, p*s, D] -> [B, p, h, s, D]: the inverse of :func:`_positions_to_heads`."""
    B, h, S, D = y.shape
    send = y.reshape(B, h, p, S // p, D).permute(2, 0, 1, 3, 4).contiguous()  # [p(dest), B, h, s, D]
    recv = torch.empty_like(send)
    dist.all_to_all_single(recv, send, group=group)  # [p(src), B, h, s, D]: src's chunk of heads, my positions
    return recv.permute(1, 0, 2, 3, 4)


class _ToHeads(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: Tensor, p: int, group: Any) -> Tensor:
        ctx.p, ctx.group = p, group
        return _positions_to_heads(x, p, group)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> Any:
        return _heads_to_positions(grad.contiguous(), ctx.p, ctx.group), None, None


class _ToPositions(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, y: Tensor, p: int, group: Any) -> Tensor:
        ctx.p, ctx.group = p, group
        return _heads_to_positions(y, p, group)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> Any:
        return _positions_to_heads(grad.contiguous(), ctx.p, ctx.group), None, None


class _Combine(torch.autograd.Function):
    """Sum over the ranks; the backward passes the gradient through unchanged (every rank computes the
    same loss from the sum, so each rank's part gets that one gradient, not P copies of it)."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, group: Any) -> Tensor:
        out = x.clone()
        dist.all_reduce(out, op=dist.ReduceOp.SUM, group=group)
        return out

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> Any:
        return grad, None


# ---- the attention function transformers calls -----------------------------------------------
def ulysses_attention(module: torch.nn.Module, query: Tensor, key: Tensor, value: Tensor,
                      attention_mask: Tensor | None, scaling: float | None = None, dropout: float = 0.0,
                      **kwargs: Any) -> tuple[Tensor, None]:
    """transformers' attention signature ([B, H, s, D] in, [B, s, H, D] out). Outside
    :func:`split_forward` it is SDPA with the model's mask; inside, Ulysses over the split positions."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    active = _GROUP.get()
    if active is None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, scaling=scaling, dropout=dropout,
                                      **kwargs)
    if kwargs.get("sliding_window") or kwargs.get("softcap") or kwargs.get("s_aux") is not None:
        raise BackendError("train.sequence_parallel: this model's attention uses a sliding window, soft-capping or "
                           "sinks, which the Ulysses split does not apply; set train.sequence_parallel = 1")
    group = active[0]
    p = dist.get_world_size(group)
    B, H, s, D = query.shape
    kv = key.shape[1]
    # One all-to-all per layer for q, k and v together: the ranks' collectives then come in one order.
    packed = torch.cat([t.reshape(B, p, n // p, s, D) for t, n in ((query, H), (key, kv), (value, kv))], dim=2)
    whole = _ToHeads.apply(packed, p, group)  # [B, (H + 2kv)/p, p*s, D]
    q, k, v = whole.split([H // p, kv // p, kv // p], dim=1)
    if H != kv:  # grouped-query: local head i reads local key-value head i // (H / kv)
        k, v = k.repeat_interleave(H // kv, dim=1), v.repeat_interleave(H // kv, dim=1)
    out = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scaling,
                                         dropout_p=dropout if module.training else 0.0)
    local = _ToPositions.apply(out, p, group)  # [B, p, H/p, s, D]
    return local.reshape(B, H, s, D).transpose(1, 2).contiguous(), None


def _inner(model: Any) -> Any:
    """The transformers model under a PEFT wrapper (or the model itself)."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def install(model: torch.nn.Module) -> None:
    """Route ``model``'s attention through :func:`ulysses_attention` (SDPA with its usual mask until a
    :func:`split_forward` is active)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface

    AttentionInterface.register(ATTENTION, ulysses_attention)
    AttentionMaskInterface.register(ATTENTION, ALL_MASK_ATTENTION_FUNCTIONS["sdpa"])
    inner = _inner(model)
    now = inner.config._attn_implementation
    if now not in ("sdpa", "eager", ATTENTION):
        raise BackendError(f"train.sequence_parallel: the model runs attention as {now!r}; the Ulysses split wraps "
                           "SDPA only (load it with attn_implementation='sdpa')")
    inner.set_attn_implementation(ATTENTION)


def check_model(model: torch.nn.Module, p: int) -> None:
    """Refuse what the split cannot run, naming the key: heads ``p`` does not divide, no plain body/head."""
    inner = _inner(model)
    config = inner.config
    heads = config.num_attention_heads
    kv = getattr(config, "num_key_value_heads", None) or heads
    if heads % p or kv % p:
        raise BackendError(f"train.sequence_parallel = {p} must divide the model's {heads} attention heads and "
                           f"{kv} key-value heads (each rank attends with 1/{p} of them)")
    if precision.split_head(model) is None:
        raise BackendError(f"train.sequence_parallel: {type(inner).__name__} has no plain body/head split to run "
                           "the body on a slice of positions; set train.sequence_parallel = 1")


@contextlib.contextmanager
def split_forward(group: Any) -> Iterator[None]:
    token = _GROUP.set((group,))
    try:
        yield
    finally:
        _GROUP.reset(token)


def split_completion_logprobs(model: torch.nn.Module, batch: dict[str, Any], temperature: float, group: Any, *,
                              with_entropy: bool = False, autocast: str = "none") -> Any:
    """[B, C] completion log-probs (and entropies) as :func:`~rlvr.backends.train.trainer.completion_logprobs`
    computes them unpacked, with the body run on this rank's slice of the positions (every rank calls it)."""
    ids, attn = batch["ids"], batch["attn"]
    if bool((attn[:, 1:] > attn[:, :-1]).any()):
        raise BackendError("train.sequence_parallel reads right-padded rows only (causal attention over the whole "
                           "split sequence stands in for the padding mask); report this")
    p, rank = dist.get_world_size(group), dist.get_rank(group)
    width = -(-ids.shape[1] // p) * p  # padded on the right to a multiple of p
    if width > ids.shape[1]:
        extra = width - ids.shape[1]
        ids, attn = F.pad(ids, (0, extra), value=int(ids[0, -1])), F.pad(attn, (0, extra))
    s = width // p
    lo, hi = rank * s, (rank + 1) * s
    inputs = forward_inputs(ids, attn)
    local = {"input_ids": ids[:, lo:hi], "position_ids": inputs["position_ids"][:, lo:hi], "use_cache": False}
    rows, index = completion_positions(batch["completion_lens"], ids.device)
    at = torch.tensor(batch["prompt_lens"], device=ids.device)[rows] - 1 + index
    mine = (at >= lo) & (at < hi)
    body, head = precision.split_head(model)  # type: ignore[misc]  # check_model refused a model without
    with split_forward(group), precision.autocast(autocast, str(ids.device)):
        hidden = body(**local).last_hidden_state  # [B, s, H]
    r, c = rows[mine], at[mine] - lo
    picked = PositionFeatures(hidden[r, c], head, None, r, c).logprobs(ids[rows, at + 1][mine], temperature,
                                                                      with_entropy=with_entropy)
    anchor = hidden[:, :1].sum() * 0.0  # joins every rank's backward to its layers' all-to-alls
    parts = picked if isinstance(picked, tuple) else (picked,)
    shape = (ids.shape[0], batch["c_max"])
    out = tuple(_Combine.apply(spread(v, rows[mine], index[mine], shape) + anchor.to(v.dtype), group)
                for v in parts)
    return out if with_entropy else out[0]


class SequenceParallelTrainer(RankTrainer):
    """One rank of a sequence-parallel trainer: every rank reads every row, a 1/P slice of each."""

    shard = "replicate"

    def __init__(self, policy: Any, *, sequence_parallel: int, **kwargs: Any):
        world = dist.get_world_size()
        if sequence_parallel != world:
            raise BackendError(f"train.sequence_parallel = {sequence_parallel} splits each sequence over every "
                               f"trainer rank, and there are {world}: run with --nproc {sequence_parallel}")
        if kwargs.get("packing") or kwargs.get("micro_batch") == "auto":
            raise BackendError("train.sequence_parallel needs train.packing = false and train.micro_batch set to a "
                               "number of rows (the split reads padded rows; 'auto' probes one process's memory)")
        check_model(policy.model, sequence_parallel)
        self.sp = sequence_parallel
        self.strategy = (f"Ulysses sequence parallelism over {sequence_parallel} ranks (all-to-all over heads around "
                         "attention), replicated weights, gradients sum-reduced")
        super().__init__(policy, **kwargs)
        self.share_prompts = False  # the split reads padded rows whole
        install(policy.model)
        if policy.reference is not None:
            install(policy.reference)

    def _share(self, rollouts: Sequence[Rollout]) -> Sequence[Rollout]:
        return rollouts  # every rank reads every row; the positions are what is split

    def _reduce(self, totals: dict[str, float]) -> dict[str, float]:
        self._sum_gradients()
        return totals  # every rank computed the same loss: its metrics are the minibatch's already

    def _logprobs(self, model: torch.nn.Module, batch: dict[str, Any], with_entropy: bool = False) -> Any:
        return split_completion_logprobs(model, batch, self.temperature, None, with_entropy=with_entropy,
                                         autocast=self.autocast)

    def describe(self) -> dict[str, Any]:
        return {**TorchTrainer.describe(self), "sequence_parallel": self.sp}
