"""The output head and log-softmax of chosen tokens, in chunks of positions that never hold [N, V] logits.

:func:`head_logprobs` takes the body's hidden states at the N positions that are scored ([N, H]), the
output head and the N target ids, and returns each target's log-prob under ``softmax(logits / T)``
(and, when asked, each position's entropy). Only ``HEAD_CHUNK_ELEMENTS`` logits of one chunk of
positions exist at a time, forward and backward, as Liger's fused linear cross-entropy does for a
loss: a 64 x 64-token micro-batch of a 49,152-token vocabulary otherwise holds 0.8 GB of float32
logits, as much again of tempered copies saved for the backward, and their gradient.

For a plain linear head (``nn.Linear`` without hooks: every Llama/Qwen-style model, tied embeddings
included) :class:`ChunkedLinearLogprobs` has its own backward. The gradient of a chosen token's
log-prob with respect to the hidden state is ``(W[t] - p @ W) / T`` (and ``-(p * (log p + H)) @ W / T``
for the entropy H), a vector per position: the forward computes it while the chunk's softmax ``p`` is
at hand and keeps only that [N, H] vector, so a LoRA backward costs no second pass over the head:
the head's matmuls are the same two as an autograd backward makes. When the head weight (or bias)
trains (full fine-tune; with tied embeddings it is the embedding matrix, whose gradient autograd sums
with the embedding lookup's), the backward recomputes each chunk's logits from the saved hidden
states and the per-position ``logsumexp``, and accumulates ``dz^T @ h`` in float32. Any other head
(one PEFT wraps, or one with hooks) is run per chunk under non-reentrant activation checkpointing:
the same memory bound, by autograd.

Precision: the matmul runs in the head weight's dtype (float32 for float32 or autocast training;
bf16 for bf16 weights, as ``head(hidden)`` would), the log-softmax and everything after it in
float32, outside any autocast (the caller's :mod:`~rlvr.backends.model.precision` rule). Equal to
materialised logits followed by :func:`~rlvr.backends.model.io.chosen_logprobs` within float32
rounding (the tests check 1e-5 on log-probs, entropies and gradients).

A backend module: imports torch only.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor
from torch.utils.checkpoint import checkpoint

HEAD_CHUNK_ELEMENTS = 1 << 23  # float32 logits of one chunk of positions (32 MiB); a few such buffers live at once


def chunk_positions(vocab: int) -> int:
    """Positions per chunk for a vocabulary of ``vocab`` entries."""
    return max(1, HEAD_CHUNK_ELEMENTS // max(1, vocab))


def plain_linear(head: Any) -> bool:
    """Whether ``head`` computes exactly ``hidden @ weight.T + bias`` (a bare ``nn.Linear`` with no hooks),
    so :class:`ChunkedLinearLogprobs` may take its weight and bias instead of calling it."""
    if type(head) is not torch.nn.Linear:
        return False
    hooks = (head._forward_hooks, head._forward_pre_hooks, torch.nn.modules.module._global_forward_hooks,
             torch.nn.modules.module._global_forward_pre_hooks)
    return not any(hooks)


def head_logprobs(hidden: Tensor, head: Any, targets: Tensor, temperature: float, *,
                  with_entropy: bool = False) -> Tensor | tuple[Tensor, Tensor]:
    """[N] log-probs of ``targets`` [N] under ``softmax(head(hidden) / temperature)`` for ``hidden`` [N, H]
    (``temperature = 0`` scores the plain logits, as greedy decoding does), and with ``with_entropy``
    each position's entropy [N]. Gradients reach ``hidden`` and the head's parameters when enabled."""
    scale = temperature if temperature > 0 else 1.0
    if plain_linear(head):
        args = (hidden.to(head.weight.dtype), head.weight, head.bias, targets, scale, with_entropy)
        if torch.is_grad_enabled():
            logp, entropy = ChunkedLinearLogprobs.apply(*args)
        else:  # nothing to keep for a backward
            logp, entropy = _chunked_forward(*args, need_hidden=False, need_head=False)[:2]
        return (logp, entropy) if with_entropy else logp
    parts = []
    step = chunk_positions(_vocab(head, hidden))
    for start in range(0, hidden.shape[0], step):
        chunk = (hidden[start:start + step], targets[start:start + step])
        if torch.is_grad_enabled():
            parts.append(checkpoint(_module_chunk, head, *chunk, scale, with_entropy, use_reentrant=False))
        else:
            parts.append(_module_chunk(head, *chunk, scale, with_entropy))
    if not parts:
        empty = hidden.new_zeros(0, dtype=torch.float32)
        return (empty, empty) if with_entropy else empty
    logp = torch.cat([p[0] for p in parts])
    return (logp, torch.cat([p[1] for p in parts])) if with_entropy else logp


def _vocab(head: Any, hidden: Tensor) -> int:
    weight = getattr(head, "weight", None)
    if isinstance(weight, Tensor) and weight.dim() == 2:
        return weight.shape[0]
    with torch.no_grad():
        return head(hidden[:1]).shape[-1]


def _module_chunk(head: Any, hidden: Tensor, targets: Tensor, scale: float, with_entropy: bool):
    """Log-probs (and entropies) of one chunk through ``head`` called as a module."""
    weight = getattr(head, "weight", None)
    z = head(hidden.to(weight.dtype) if isinstance(weight, Tensor) else hidden).float()
    z = z / scale if scale != 1.0 else z
    logp_all = torch.log_softmax(z, dim=-1)
    chosen = logp_all.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    if not with_entropy:
        return chosen, None
    p = logp_all.exp()
    return chosen, -(p * torch.where(p > 0, logp_all, 0.0)).sum(-1)


def _logits(hidden: Tensor, weight: Tensor, bias: Tensor | None, scale: float) -> Tensor:
    """float32 ``(hidden @ weight.T + bias) / scale`` for one chunk, the matmul in the weight's dtype."""
    z = hidden @ weight.t()
    if bias is not None:
        z = z + bias
    z = z.float()
    return z.div_(scale) if scale != 1.0 else z


def _chunked_forward(hidden: Tensor, weight: Tensor, bias: Tensor | None, targets: Tensor, scale: float,
                     with_entropy: bool, *, need_hidden: bool,
                     need_head: bool) -> tuple[Tensor, Tensor, Tensor | None, Tensor | None, Tensor | None]:
    """``(logp, entropy, lse, to_logp, to_entropy)``: the outputs, each position's ``logsumexp`` (kept when
    the head trains, for the backward's recompute) and the per-position gradient directions with respect
    to ``hidden`` (kept when it needs a gradient); ``None`` where not needed."""
    n, width = hidden.shape
    logp = torch.empty(n, dtype=torch.float32, device=hidden.device)
    entropy = torch.zeros(n, dtype=torch.float32, device=hidden.device)
    lse = torch.empty(n, dtype=torch.float32, device=hidden.device) if need_head else None
    to_logp = hidden.new_empty((n, width), dtype=torch.float32) if need_hidden else None
    to_entropy = hidden.new_empty((n, width), dtype=torch.float32) if need_hidden and with_entropy else None
    step = chunk_positions(weight.shape[0])
    for start in range(0, n, step):
        end = min(n, start + step)
        t = targets[start:end]
        z = _logits(hidden[start:end], weight, bias, scale)
        norm = torch.logsumexp(z, dim=-1)
        logp[start:end] = z.gather(1, t.unsqueeze(1)).squeeze(1) - norm
        if lse is not None:
            lse[start:end] = norm
        if not (with_entropy or need_hidden):
            continue
        log_p = z.sub_(norm.unsqueeze(1))  # z is not needed again: log p in place
        p = log_p.exp()
        if with_entropy:
            entropy[start:end] = -(p * log_p).sum(-1)
        if to_logp is not None:  # (W[t] - p @ W) / T
            expected = (p.to(weight.dtype) @ weight).float()
            to_logp[start:end] = (weight[t].float() - expected).div_(scale)
        if to_entropy is not None:  # -(p (log p + H)) @ W / T, p and log p overwritten: not needed again
            q = p.mul_(log_p.add_(entropy[start:end].unsqueeze(1)))
            to_entropy[start:end] = (q.to(weight.dtype) @ weight).float().div_(-scale)
    return logp, entropy, lse, to_logp, to_entropy


class ChunkedLinearLogprobs(torch.autograd.Function):
    """``(logp [N], entropy [N])`` of ``targets`` under ``softmax((hidden @ weight.T + bias) / scale)``,
    chunk by chunk (see the module docstring). ``entropy`` is zeros, and not differentiable, unless
    ``with_entropy``."""

    @staticmethod
    def forward(ctx, hidden: Tensor, weight: Tensor, bias: Tensor | None, targets: Tensor, scale: float,
                with_entropy: bool) -> tuple[Tensor, Tensor]:
        need_head = ctx.needs_input_grad[1] or (bias is not None and ctx.needs_input_grad[2])
        out = _chunked_forward(hidden, weight, bias, targets, scale, with_entropy,
                               need_hidden=ctx.needs_input_grad[0], need_head=need_head)
        logp, entropy, lse, to_logp, to_entropy = out
        if not with_entropy:
            ctx.mark_non_differentiable(entropy)
        ctx.set_materialize_grads(False)
        ctx.scale, ctx.with_entropy, ctx.need_head = scale, with_entropy, need_head
        ctx.has_bias, ctx.hidden_dtype = bias is not None, hidden.dtype
        ctx.save_for_backward(to_logp, to_entropy, *((hidden, weight, bias, targets, lse, entropy)
                                                     if need_head else ()))
        return logp, entropy

    @staticmethod
    def backward(ctx, grad_logp: Tensor | None, grad_entropy: Tensor | None) -> tuple[Any, ...]:
        saved = ctx.saved_tensors
        to_logp, to_entropy = saved[0], saved[1]
        grad_entropy = grad_entropy if ctx.with_entropy else None
        grad_hidden = grad_weight = grad_bias = None
        if ctx.needs_input_grad[0]:
            grad_hidden = torch.zeros_like(to_logp)
            if grad_logp is not None:
                grad_hidden.addcmul_(grad_logp.float().unsqueeze(1), to_logp)
            if grad_entropy is not None:
                grad_hidden.addcmul_(grad_entropy.float().unsqueeze(1), to_entropy)
            grad_hidden = grad_hidden.to(ctx.hidden_dtype)
        if ctx.need_head:
            grad_weight, grad_bias = _head_grads(ctx, saved[2:], grad_logp, grad_entropy)
        return grad_hidden, grad_weight, grad_bias, None, None, None


def _head_grads(ctx: Any, saved: tuple[Tensor, ...], grad_logp: Tensor | None,
                grad_entropy: Tensor | None) -> tuple[Tensor | None, Tensor | None]:
    """The head weight's (and bias's) gradient: each chunk's logits recomputed, ``dz^T @ hidden`` summed
    in float32."""
    hidden, weight, bias, targets, lse, entropy = saved
    weight_sum = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device)
    grad_bias = torch.zeros(weight.shape[0], dtype=torch.float32, device=weight.device) if ctx.has_bias else None
    step = chunk_positions(weight.shape[0])
    for start in range(0, hidden.shape[0], step):
        end = min(hidden.shape[0], start + step)
        log_p = _logits(hidden[start:end], weight, bias, ctx.scale).sub_(lse[start:end].unsqueeze(1))
        p = log_p.exp()
        dz = torch.zeros_like(p)
        if grad_logp is not None:  # d logp_t / dz = onehot(t) - p
            g = grad_logp[start:end].float().unsqueeze(1)
            dz.sub_(p * g).scatter_add_(1, targets[start:end].unsqueeze(1), g)
        if grad_entropy is not None:  # d H / dz = -p (log p + H)
            dz.sub_(p.mul_(log_p.add_(entropy[start:end].unsqueeze(1))) * grad_entropy[start:end].float().unsqueeze(1))
        dz.div_(ctx.scale)
        weight_sum.add_((dz.t().to(weight.dtype) @ hidden[start:end]).float())
        if grad_bias is not None:
            grad_bias.add_(dz.sum(0))
    grad_weight = weight_sum.to(weight.dtype) if ctx.needs_input_grad[1] else None
    if grad_bias is not None:
        grad_bias = grad_bias.to(bias.dtype) if ctx.needs_input_grad[2] else None
    return grad_weight, grad_bias
