"""Masking and aggregation of per-token loss tensors into scalars.

Invariant: a position whose mask is 0 never influences a result, even when it holds NaN or inf —
selection is done with ``torch.where``, never by multiplying with the mask (``NaN * 0`` is NaN).
Fully masked rows contribute 0 and are not counted as sequences. Imports only torch.
"""

from __future__ import annotations

import torch
from torch import Tensor

AGGREGATIONS: tuple[str, ...] = (
    "token-mean",
    "seq-mean-token-mean",
    "seq-mean-token-sum",
    "constant",
)
DEFAULT_AGGREGATION = "token-mean"


def member(mask: Tensor) -> Tensor:
    """Boolean membership of a 0/1 (or weight) mask: nonzero entries are members."""
    return mask if mask.dtype == torch.bool else mask != 0


def zero_outside(x: Tensor, mask: Tensor) -> Tensor:
    """``x`` where ``mask`` is nonzero, exactly 0 elsewhere (NaN/inf outside the mask are dropped).

    Done with ``torch.where`` so the gradient reaching ``x`` outside the mask is exactly 0, and
    nothing computed downstream from the result can turn a masked-out NaN into a NaN gradient.
    """
    return torch.where(member(mask), x, torch.zeros_like(x))


def masked_mean(x: Tensor, mask: Tensor) -> Tensor:
    """Mean of ``x`` over mask members; 0 when there are none."""
    keep = member(mask)
    total = zero_outside(x, keep).sum()
    return total / keep.sum().clamp(min=1).to(total.dtype)


def aggregate(
    loss_tokens: Tensor,
    mask: Tensor,
    mode: str = DEFAULT_AGGREGATION,
    constant: float | None = None,
    denominator: float | None = None,
) -> Tensor:
    """Reduce a [B,T] per-token loss to a scalar over the tokens selected by ``mask``.

    With L the per-token loss, m the mask, n_i = Σ_t m_{i,t}, N_tok = Σ_i n_i and
    N_seq = #{i : n_i ≥ 1} (rows with at least one token):

    - ``token-mean`` (``DEFAULT_AGGREGATION``; every policy loss's default but gspo's): Σ_{i,t} m L / max(N_tok, 1).
    - ``seq-mean-token-mean``: Σ_i [Σ_t m L / n_i] / max(N_seq, 1).
    - ``seq-mean-token-sum``: Σ_i [Σ_t m L] / max(N_seq, 1).
    - ``constant`` (Dr.GRPO): Σ_i [Σ_t m L] / (max(N_seq, 1) · C), C = ``constant`` (e.g. the max
      completion length), i.e. seq-mean-token-sum divided by a constant, as verl's
      ``seq-mean-token-sum-norm`` does in verl.

    Fully masked rows contribute 0 and are left out of N_seq; an all-zero mask gives 0 (still
    attached to the graph of ``loss_tokens``). Weights other than 0/1 are not applied here:
    multiply them into ``loss_tokens`` first; ``mask`` only selects members.

    ``denominator`` replaces N_tok (token-mean) or N_seq (the other modes) by a count over a larger
    batch that this one is a part of (clamped to >= 1), so the parts' results sum to the whole's.
    """
    keep = member(mask)
    if keep.shape != loss_tokens.shape:
        raise ValueError(f"mask shape {tuple(keep.shape)} != loss shape {tuple(loss_tokens.shape)}")
    if mode not in AGGREGATIONS:
        raise ValueError(f"aggregation mode {mode!r} is not one of {AGGREGATIONS}")
    dtype = loss_tokens.dtype
    picked = zero_outside(loss_tokens, keep)
    given = None if denominator is None else loss_tokens.new_tensor(max(float(denominator), 1.0))
    if mode == "token-mean":
        return picked.sum() / (keep.sum().clamp(min=1).to(dtype) if given is None else given)
    row_n = keep.sum(-1)
    n_seq = (row_n > 0).sum().clamp(min=1).to(dtype) if given is None else given
    row_sum = picked.sum(-1)
    if mode == "seq-mean-token-mean":
        return (row_sum / row_n.clamp(min=1).to(dtype)).sum() / n_seq
    if mode == "seq-mean-token-sum":
        return row_sum.sum() / n_seq
    if constant is None or not constant > 0:
        raise ValueError(f"aggregation 'constant' needs a constant > 0, got {constant!r}")
    return row_sum.sum() / (n_seq * constant)
