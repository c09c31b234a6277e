"""The critic's math: GAE over token positions, masked whitening, the clipped value loss, explained variance.

Every tensor is [B, T] over completion positions (prompt positions never appear; padding past a
completion has mask 0). The formulas are verl's (``verl/trainer/ppo/core_algos.py`` and
``verl/utils/torch_functional.py``, cited in ``reference/algorithms.md`` §2.13):

- GAE: δ_t = r_t + γ·V_{t+1} − V_t, A_t = δ_t + γλ·A_{t+1}, scanned from the last position. At a
  position with mask 0 (padding, or tokens the environment added) neither the next value nor the
  running advantage changes: the scan carries them through, so V_{t+1} is the value of the next
  *trained* token and a masked position's value never matters. returns = A + V (before whitening).
- whitening: (A − μ) / sqrt(σ² + 1e-8), μ and σ² over the mask's tokens, σ² with Bessel's
  correction (n/(n−1)) as verl's ``masked_whiten``. verl raises on a single token; here fewer than
  two tokens whiten to 0 (no spread to scale by), so one odd batch does not stop a run.
- value loss: ½ · agg(max((V − R)², (clip(V, V_old − c, V_old + c) − R)²)), agg a token-mean over
  the mask, with ``denominator`` standing for the token count when micro-batches share one minibatch;
  the clip fraction counts the tokens where the clipped error is the larger.
- explained variance: 1 − Var(R − V) / (Var(R) + 1e-5) over the mask (verl's ``vf_explained_var``).

Invariant: positions outside the mask are exactly 0 in every output and never reach a loss or a
gradient, even when they hold NaN. Imports only torch.
"""

from __future__ import annotations

import torch
from torch import Tensor

WHITEN_EPS = 1e-8
EXPLAINED_VARIANCE_EPS = 1e-5


def gae(rewards: Tensor, values: Tensor, mask: Tensor, gamma: float, lam: float) -> tuple[Tensor, Tensor]:
    """(advantages, returns), both [B, T] and 0 outside ``mask``; no gradient (values are the old critic's)."""
    keep = mask.bool()
    with torch.no_grad():
        rewards, values = torch.where(keep, rewards, 0.0), torch.where(keep, values, 0.0)
        next_value = values.new_zeros(values.shape[0])
        running = values.new_zeros(values.shape[0])
        advantages = torch.zeros_like(values)
        for t in reversed(range(values.shape[1])):
            delta = rewards[:, t] + gamma * next_value - values[:, t]
            candidate = delta + gamma * lam * running
            next_value = torch.where(keep[:, t], values[:, t], next_value)
            running = torch.where(keep[:, t], candidate, running)
            advantages[:, t] = running
        advantages = torch.where(keep, advantages, 0.0)
        return advantages, torch.where(keep, advantages + values, 0.0)


def masked_whiten(values: Tensor, mask: Tensor) -> Tensor:
    """``values`` standardised over the mask's tokens (Bessel-corrected variance); 0 outside the mask,
    and 0 everywhere when fewer than two tokens are in it."""
    keep = mask.bool()
    n = int(keep.sum())
    if n < 2:
        return torch.zeros_like(values)
    picked = values[keep]
    mean = picked.mean()
    var = ((picked - mean) ** 2).sum() / (n - 1)
    return torch.where(keep, (values - mean) * torch.rsqrt(var + WHITEN_EPS), 0.0)


def value_loss(vpreds: Tensor, old_values: Tensor, returns: Tensor, mask: Tensor, clip: float,
               denominator: float | None = None) -> tuple[Tensor, Tensor]:
    """(loss, clip count / denominator): verl's clipped value loss and the share of tokens it clipped.

    ``denominator`` (default: the mask's token count, at least 1) divides both, so the micro-batches of
    one minibatch, each given the minibatch's count, add up to the minibatch's loss and fraction."""
    keep = mask.bool()
    vpreds = torch.where(keep, vpreds, 0.0)
    old_values, returns = torch.where(keep, old_values, 0.0), torch.where(keep, returns, 0.0)
    clipped = torch.clamp(vpreds, old_values - clip, old_values + clip)
    unclipped_error, clipped_error = (vpreds - returns) ** 2, (clipped - returns) ** 2
    worst = torch.where(keep, torch.maximum(unclipped_error, clipped_error), 0.0)
    count = float(denominator) if denominator is not None else max(float(keep.sum()), 1.0)
    clip_count = (keep & (clipped_error > unclipped_error)).sum().to(worst.dtype)
    return 0.5 * worst.sum() / count, clip_count.detach() / count


def explained_variance(returns: Tensor, values: Tensor, mask: Tensor) -> float:
    """1 − Var(R − V) / (Var(R) + 1e-5) over the mask (unbiased variances); nan with fewer than two tokens."""
    keep = mask.bool()
    if int(keep.sum()) < 2:
        return float("nan")
    r, v = returns[keep].double(), values[keep].double()
    return float(1.0 - torch.var(r - v) / (torch.var(r) + EXPLAINED_VARIANCE_EPS))
