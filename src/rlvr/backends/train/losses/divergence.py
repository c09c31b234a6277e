"""KL estimators, the reverse-KL distillation signal, IS weights against the sampler and entropy.

Sign convention: Δ = logπ_θ − logπ_ref per sampled token, so with
tokens drawn from π_θ, k1 is an unbiased estimator of KL(π_θ‖π_ref) and k3 an unbiased,
non-negative one. Estimators are per-token [B,T] tensors with gradient through logπ_θ; the
reference is treated as a constant.

Clamping: k3 (the default estimator, ``kl_k3``) is clamped as verl's ``low_var_kl``: Δ to
[−20, 20] before the exp, then the value to [−10, 10]. TRL and the fw cookbook leave k3 unclamped,
where one token whose log-probability fell far below the reference's gives exp(−Δ) = inf and a
non-finite step; the clamp keeps value and gradient finite, at the price of no gradient from a
token whose k3 exceeds 10 (Δ below about −2.6 or above 11). ``kl_k3(..., clamp=False)`` is the
plain formula. k1 and k2 are polynomial in Δ and are not clamped (as in all three projects).
Imports only torch.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from rlvr.backends.train.losses.policy import ratio

K3_LOG_RATIO_CAP = 20.0
K3_CAP = 10.0


def kl_k1(logp: Tensor, ref_logp: Tensor) -> Tensor:
    """k1 = Δ = logπ_θ − logπ_ref (unbiased, can be negative; gradient ∇logπ_θ)."""
    return logp - ref_logp.detach()


def kl_k2(logp: Tensor, ref_logp: Tensor) -> Tensor:
    """k2 = ½Δ² (biased, low variance; gradient Δ·∇logπ_θ)."""
    return 0.5 * (logp - ref_logp.detach()).square()


def kl_k3(logp: Tensor, ref_logp: Tensor, *, clamp: bool = True) -> Tensor:
    """k3 = exp(−Δ) + Δ − 1 (unbiased, ≥ 0; gradient (1 − exp(−Δ))·∇logπ_θ).

    With ``clamp`` (the default, verl's ``low_var_kl``): Δ is clamped to [−20, 20] before the exp
    and k3 to [−10, 10], so value and gradient stay finite for any finite Δ; inside both clamps the
    value and gradient are the plain formula's, outside them the gradient is 0. A NaN stays NaN.
    """
    delta = logp - ref_logp.detach()
    if not clamp:
        return torch.expm1(-delta) + delta
    delta = delta.clamp(-K3_LOG_RATIO_CAP, K3_LOG_RATIO_CAP)
    return (torch.expm1(-delta) + delta).clamp(-K3_CAP, K3_CAP)


KL_ESTIMATORS: dict[str, Callable[[Tensor, Tensor], Tensor]] = {
    "k1": kl_k1,
    "k2": kl_k2,
    "k3": kl_k3,
}


def ref_kl_loss(logp: Tensor, old_logp: Tensor, ref_logp: Tensor) -> Tensor:
    """Reverse KL to a reference used as a policy-gradient signal (on-policy distillation).

    Per-token advantage a_t = sg(logπ_ref − logπ_θ) (the negative single-sample reverse KL),
    optimised with the IS loss: L = −a_t · ρ, ρ = exp(logπ_θ − sg(logπ_old)). On-policy
    (ρ = 1 in value) L equals the sampled reverse KL logπ_θ − logπ_ref and its gradient is
    (logπ_θ − logπ_ref)·∇logπ_θ — the fw/tinker OPD form, without prime-rl's extra mask and
    inference-KL term.
    """
    signal = (ref_logp - logp).detach()
    return -signal * ratio(logp, old_logp)


def tis_weight(old_logp: Tensor, sampler_logp: Tensor, cap: float) -> tuple[Tensor, Tensor]:
    """Truncated importance weight against the sampler (truncated IS): w = min(π_old/π_sampler, cap).

    w = min(exp(clamp(logπ_old − logπ_sampler, ±20)), cap), detached; it multiplies the per-token
    policy loss. Returns ``(w, truncated)`` where ``truncated`` is the float 0/1 indicator of
    raw weight > cap.
    """
    raw = ratio(old_logp.detach(), sampler_logp).detach()
    return raw.clamp(max=cap), (raw > cap).to(torch.float32)


IS_LEVELS = ("token", "sequence", "sequence_product")


def sampler_log_ratio(old_logp: Tensor, sampler_logp: Tensor, mask: Tensor, level: str) -> Tensor:
    """log(π_old/π_sampler) at ``level``, [B,T], detached; 0 outside ``mask``.

    ``token``: each token's ℓ_t = logπ_old − logπ_sampler. ``sequence``: the geometric mean of the
    row's token ratios, mean_t ℓ_t over its mask (as GSPO's ratio and the fw cookbook's sequence
    TIS), on every token of the row. ``sequence_product``: their product, Σ_t ℓ_t (TRL's
    ``sequence_*`` modes and verl's ``sequence`` rollout IS); it grows with the length, so a long
    completion drifts out of any bound faster than a short one at the same per-token mismatch.
    """
    keep = mask != 0
    log_r = torch.where(keep, old_logp.detach() - sampler_logp.detach(), torch.zeros_like(old_logp))
    if level == "token":
        return log_r
    if level not in IS_LEVELS:
        raise ValueError(f"IS level {level!r} is not one of {list(IS_LEVELS)}")
    per_row = log_r.sum(-1, keepdim=True)
    if level == "sequence":
        per_row = per_row / keep.sum(-1, keepdim=True).clamp(min=1).to(per_row.dtype)
    return torch.where(keep, per_row.expand_as(log_r), torch.zeros_like(log_r))


def sampler_is_weight(old_logp: Tensor, sampler_logp: Tensor, mask: Tensor, *, level: str = "token",
                      cap: float | None = None, low: float | None = None,
                      high: float | None = None) -> tuple[Tensor, Tensor]:
    """The detached IS weight against the sampler, [B,T], and its 0/1 indicator, [B,T].

    With r = exp(clamp(``sampler_log_ratio``, ±20)): truncated IS (``cap``): w = min(r, cap), the
    indicator r > cap; masked IS (``high``, optional ``low``; IcePop with both): w = r inside
    [low, high], 0 outside, the indicator "outside". At a sequence level every token of a row
    shares its row's weight, so a masked row drops out whole. Exactly one of ``cap``/``high``.
    """
    if (cap is None) == (high is None):
        raise ValueError("give cap (truncated IS) or high (masked IS), exactly one")
    raw = torch.exp(sampler_log_ratio(old_logp, sampler_logp, mask, level).clamp(-20.0, 20.0))
    if cap is not None:
        return raw.clamp(max=cap), (raw > cap).to(torch.float32)
    assert high is not None  # exactly one of the two, checked above
    inside = raw <= high
    if low is not None:
        inside = inside & (raw >= low)
    return torch.where(inside, raw, torch.zeros_like(raw)), (~inside).to(torch.float32)


def entropy_from_logits(logits: Tensor) -> Tensor:
    """Per-position entropy H = −Σ_v p_v log p_v of softmax(logits) over the last axis.

    [B,T,V] → [B,T], computed in float32 from ``log_softmax``; vocabulary entries with logit −inf
    (p = 0) contribute 0 rather than NaN. Differentiable (use under ``no_grad`` for a metric).
    """
    logp = torch.log_softmax(logits.float(), dim=-1)
    p = logp.exp()
    # Replace log p by 0 where p = 0 *before* the product, so backward never forms 0·(−inf).
    safe_logp = torch.where(p > 0, logp, torch.zeros_like(logp))
    return -(p * safe_logp).sum(-1)
