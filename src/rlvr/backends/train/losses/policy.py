"""Policy-gradient losses: one small pure function per variant, math in the docstring.

Every function takes [B,T] tensors over completion positions, already aligned by the caller:
``logp`` (log π_θ of the taken token, with grad), ``old_logp`` (log π_old, the policy the ratio
is taken against; treated as a constant), ``adv`` (per-token advantage A) and returns the
per-token loss L (the quantity minimised) as a [B,T] tensor, plus a dict of per-token 0/1
diagnostics (e.g. clip indicators). Aggregation over tokens happens elsewhere.

Conventions: ℓ = logp − old_logp, ρ = exp(ℓ) with ℓ clamped to
[−20, 20] before exp (as verl and the fw cookbook do) so an extreme ratio stays finite; sg(·) is
stop-gradient. Values at positions outside the caller's mask are not meaningful and must be
dropped by the aggregator; the caller zeroes non-finite entries there first (``compute_loss``
does). Imports only torch.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from rlvr.backends.train.losses.aggregation import DEFAULT_AGGREGATION, member, zero_outside

LOG_RATIO_CAP = 20.0
GSPO_LOG_RATIO_MAX = 10.0

Diagnostics = dict[str, Tensor]
PolicyLossFn = Callable[..., tuple[Tensor, Diagnostics]]


def ratio(logp: Tensor, old_logp: Tensor) -> Tensor:
    """ρ = exp(clamp(logp − sg(old_logp), −20, 20)); gradient ρ·∇logp inside the clamp."""
    return torch.exp((logp - old_logp.detach()).clamp(-LOG_RATIO_CAP, LOG_RATIO_CAP))


def _flag(x: Tensor) -> Tensor:
    return x.to(torch.float32)


def reinforce(logp: Tensor, adv: Tensor) -> tuple[Tensor, Diagnostics]:
    """Plain REINFORCE: L = −A · logπ_θ. No ratio; the old policy is ignored."""
    return -adv * logp, {}


def importance_sampling(
    logp: Tensor, old_logp: Tensor, adv: Tensor
) -> tuple[Tensor, Diagnostics]:
    """Unclipped IS policy gradient (Tinker-style ``importance_sampling``): L = −ρ · A.

    Gradient −ρ·A·∇logπ_θ; at ρ = 1 it is the REINFORCE gradient.
    """
    return -ratio(logp, old_logp) * adv, {}


def grpo(logp: Tensor, old_logp: Tensor, adv: Tensor) -> tuple[Tensor, Diagnostics]:
    """GRPO as REINFORCE in ratio form: L = −A · exp(logπ_θ − sg(logπ_old)).

    On-policy (old_logp = sg(logp)) the ratio is 1 in value and only carries the gradient, so the
    loss value is −A and the gradient is exactly the REINFORCE gradient −A·∇logπ_θ; off-policy
    (later PPO minibatches) it is the IS-corrected gradient −ρ·A·∇logπ_θ. Per token this equals
    ``importance_sampling``; the KL penalty of GRPO is ``LossConfig.kl_coef``, added by
    ``compute_loss``, and there is no clipping (use ``ppo``/``dapo`` for that).
    """
    return importance_sampling(logp, old_logp, adv)


def ppo(
    logp: Tensor,
    old_logp: Tensor,
    adv: Tensor,
    eps_low: float = 0.2,
    eps_high: float = 0.2,
    dual_clip: float | None = None,
) -> tuple[Tensor, Diagnostics]:
    """PPO clipped surrogate: L = max(−A·ρ, −A·clip(ρ, 1−ε_low, 1+ε_high)).

    Dual clip (A < 0 only, c > 1): L = min(L, −A·c), bounding the loss of a very large ratio on a
    negative advantage. Diagnostics: ``clip_frac_low`` (ρ < 1−ε_low ∧ A < 0), ``clip_frac_high``
    (ρ > 1+ε_high ∧ A > 0), ``clip_frac`` (either: the clipped branch is active and the token has
    no gradient), ``dual_clip_frac`` (dual clip active) when c is given.
    """
    rho = ratio(logp, old_logp)
    unclipped = -adv * rho
    clipped = -adv * rho.clamp(1.0 - eps_low, 1.0 + eps_high)
    loss = torch.maximum(unclipped, clipped)
    low = (rho < 1.0 - eps_low) & (adv < 0)
    high = (rho > 1.0 + eps_high) & (adv > 0)
    diag = {
        "clip_frac": _flag(low | high),
        "clip_frac_low": _flag(low),
        "clip_frac_high": _flag(high),
    }
    if dual_clip is not None:
        bound = -adv * dual_clip
        dual = (adv < 0) & (loss > bound)
        loss = torch.where(dual, bound, loss)
        diag["dual_clip_frac"] = _flag(dual)
    return loss, diag


def dapo(
    logp: Tensor,
    old_logp: Tensor,
    adv: Tensor,
    eps_low: float = 0.2,
    eps_high: float = 0.28,
    dual_clip: float | None = None,
) -> tuple[Tensor, Diagnostics]:
    """DAPO clip-higher: ``ppo`` with asymmetric defaults ε_low = 0.2, ε_high = 0.28.

    The 0.28 upper bound is the DAPO recommendation (TRL docstring, fw ``make_dapo_loss_fn``).
    DAPO's token-level normalisation is the ``token-mean`` aggregation, the library default.
    """
    return ppo(logp, old_logp, adv, eps_low, eps_high, dual_clip)


def gspo(
    logp: Tensor,
    old_logp: Tensor,
    adv: Tensor,
    mask: Tensor,
    eps_low: float = 3e-4,
    eps_high: float = 4e-4,
) -> tuple[Tensor, Diagnostics]:
    """GSPO sequence ratio in the token-level stop-gradient form (as verl implements ``gspo``).

    s_i = exp((1/n_i) Σ_t m_t ℓ_{i,t}) (geometric mean of the token ratios over the mask, n_i
    clamped ≥ 1); per token log s_{i,t} = logπ_t − sg(logπ_t) + sg(log s_i), clamped at max 10.
    L = max(−A·s_{i,t}, −A·clip(s_{i,t}, 1−ε_low, 1+ε_high)). The value of s_{i,t} is s_i, and
    ∂L_{i,t}/∂logπ_{i,t} = −A_{i,t}·s_i when unclipped (no cross-token gradient); for a
    sequence-level A and ``seq-mean-token-mean`` aggregation this is the gradient of the GSPO
    objective. Defaults are the GSPO paper's ε (3e-4, 4e-4). ``seq-mean-token-mean`` is gspo's
    default aggregation (``default_aggregation``); unlike verl, an explicit other mode is honoured.
    """
    keep = member(mask)
    log_ratio = zero_outside(logp - old_logp, keep)
    n = keep.sum(-1, keepdim=True).clamp(min=1).to(log_ratio.dtype)
    log_s = (log_ratio.sum(-1, keepdim=True) / n).detach()
    s = torch.exp((logp - logp.detach() + log_s).clamp(max=GSPO_LOG_RATIO_MAX))
    loss = torch.maximum(-adv * s, -adv * s.clamp(1.0 - eps_low, 1.0 + eps_high))
    clip = ((s < 1.0 - eps_low) & (adv < 0)) | ((s > 1.0 + eps_high) & (adv > 0))
    return loss, {"clip_frac": _flag(clip)}


def cispo(
    logp: Tensor, old_logp: Tensor, adv: Tensor, cap: float = 5.0
) -> tuple[Tensor, Diagnostics]:
    """CISPO (MiniMax-M1): L = −sg(min(ρ, cap)) · A · logπ_θ.

    The clipped IS weight only scales the gradient −w·A·∇logπ_θ, which never vanishes. One-sided
    absolute cap, the MiniMax-M1/ScaleRL form (TRL recommends 5.0, Tinker uses 4.0); verl and fw
    instead clip two-sided around 1. Diagnostic ``clip_frac``: ρ > cap.
    """
    rho = ratio(logp, old_logp).detach()
    weight = rho.clamp(max=cap)
    return -weight * adv * logp, {"clip_frac": _flag(rho > cap)}


def dro(
    logp: Tensor, old_logp: Tensor, adv: Tensor, beta: float = 0.05
) -> tuple[Tensor, Diagnostics]:
    """DRO quadratic old-policy penalty: L = −(logπ_θ·A − ½β(logπ_θ − logπ_old)²).

    Gradient −A + β(logπ_θ − logπ_old) per unit ∇logπ_θ. The penalty applies at every token,
    including A = 0 (verl's form; the fw cookbook gates it on A ≠ 0). β = 0.05 is the fw default.
    """
    delta = logp - old_logp.detach()
    return -(logp * adv - 0.5 * beta * delta.square()), {}


def dppo(
    logp: Tensor,
    anchor_logp: Tensor,
    adv: Tensor,
    mask: Tensor,
    mask_low: float = 0.2,
    mask_high: float = 0.2,
    adv_tau: float = 1.0,
    kl_tau: float = 1e-3,
) -> tuple[Tensor, Diagnostics]:
    """DPPO+KL, prime-rl's default rl loss: an unclipped IS policy gradient inside a trust region on
    the *probability difference*, plus a squared log-ratio penalty.

    With μ the anchor (the sampler's log-prob where the caller has it, see ``compute_loss``),
    ρ = exp(logπ_θ − logμ) (with gradient, clamped at ±20 in log space like every ratio here) and
    Δp = exp(logπ_θ) − exp(logμ) (no gradient: it only selects tokens), a token is masked out of the
    policy gradient when the update already moved it too far in the direction its advantage pushes:
    Δp > ``mask_high`` where A > 0, Δp < −``mask_low`` where A ≤ 0. Then

        L_t = −keep_t · τ_adv · A_t · ρ_t + τ_KL · m_t · (logπ_θ − logμ)²

    A masked token keeps the KL term and still counts in the aggregation's normaliser. Defaults
    are prime-rl's (``dppo_mask_low`` = ``dppo_mask_high`` = 0.2, ``adv_tau`` = 1, ``kl_tau`` = 1e-3).
    Diagnostics: ``clip_frac`` (masked), ``dppo_masked_low``, ``dppo_masked_high``.
    """
    anchor = anchor_logp.detach()
    rho = ratio(logp, anchor)
    delta_p = torch.exp(logp.detach()) - torch.exp(anchor)
    high = (adv > 0) & (delta_p > mask_high)
    low = (adv <= 0) & (delta_p < -mask_low)
    keep = ~(high | low)
    inside = _flag(member(mask))
    loss = -_flag(keep) * adv_tau * adv * rho + kl_tau * inside * (logp - anchor).square()
    return loss, {"clip_frac": _flag(high | low), "dppo_masked_low": _flag(low), "dppo_masked_high": _flag(high)}


def _pick(value: float | None, default: float) -> float:
    return default if value is None else value


# Registry entries: one uniform signature ``(logp, old_logp, adv, mask, **params)`` where the params
# are plain values (``clip_eps_low``, ``clip_eps_high``, ``dual_clip``, ``cispo_cap``, ``dro_beta``,
# ``dppo_mask_low``, ``dppo_mask_high``, ``dppo_adv_tau``, ``dppo_kl_tau``; None = the variant
# function's default). Each entry reads the ones it needs and ignores the rest.


def _grpo_entry(logp: Tensor, old: Tensor, adv: Tensor, mask: Tensor, **_: float | None):
    return grpo(logp, old, adv)


def _ppo_entry(logp: Tensor, old: Tensor, adv: Tensor, mask: Tensor, *, clip_eps_low: float | None = None,
               clip_eps_high: float | None = None, dual_clip: float | None = None, **_: float | None):
    return ppo(logp, old, adv, _pick(clip_eps_low, 0.2), _pick(clip_eps_high, 0.2), dual_clip)


def _dapo_entry(logp: Tensor, old: Tensor, adv: Tensor, mask: Tensor, *, clip_eps_low: float | None = None,
                clip_eps_high: float | None = None, dual_clip: float | None = None, **_: float | None):
    return dapo(logp, old, adv, _pick(clip_eps_low, 0.2), _pick(clip_eps_high, 0.28), dual_clip)


def _gspo_entry(logp: Tensor, old: Tensor, adv: Tensor, mask: Tensor, *, clip_eps_low: float | None = None,
                clip_eps_high: float | None = None, **_: float | None):
    return gspo(logp, old, adv, mask, _pick(clip_eps_low, 3e-4), _pick(clip_eps_high, 4e-4))


def _cispo_entry(logp: Tensor, old: Tensor, adv: Tensor, mask: Tensor, *, cispo_cap: float | None = None,
                 **_: float | None):
    return cispo(logp, old, adv, _pick(cispo_cap, 5.0))


def _is_entry(logp: Tensor, old: Tensor, adv: Tensor, mask: Tensor, **_: float | None):
    return importance_sampling(logp, old, adv)


def _reinforce_entry(logp: Tensor, old: Tensor, adv: Tensor, mask: Tensor, **_: float | None):
    return reinforce(logp, adv)


def _dro_entry(logp: Tensor, old: Tensor, adv: Tensor, mask: Tensor, *, dro_beta: float | None = None,
               **_: float | None):
    return dro(logp, old, adv, _pick(dro_beta, 0.05))


def _dppo_entry(logp: Tensor, old: Tensor, adv: Tensor, mask: Tensor, *, dppo_mask_low: float | None = None,
                dppo_mask_high: float | None = None, dppo_adv_tau: float | None = None,
                dppo_kl_tau: float | None = None, **_: float | None):
    return dppo(logp, old, adv, mask, _pick(dppo_mask_low, 0.2), _pick(dppo_mask_high, 0.2),
                _pick(dppo_adv_tau, 1.0), _pick(dppo_kl_tau, 1e-3))


POLICY_LOSSES: dict[str, PolicyLossFn] = {
    "grpo": _grpo_entry,
    "ppo": _ppo_entry,
    "dapo": _dapo_entry,
    "gspo": _gspo_entry,
    "cispo": _cispo_entry,
    "importance_sampling": _is_entry,
    "reinforce": _reinforce_entry,
    "dro": _dro_entry,
    "dppo": _dppo_entry,
}
"""Name → ``fn(logp, old_logp, adv, mask, **params) -> (loss_tokens, diagnostics)``."""

ZERO_AT_ZERO_ADVANTAGE = frozenset({"grpo", "ppo", "dapo", "gspo", "cispo", "importance_sampling", "reinforce"})
"""Losses whose per-token value and gradient are exactly 0 where the advantage is 0, whatever the
ratio (each is −A times a function of it): a token of advantage 0 adds nothing to them. ``dro``
and ``dppo`` add a squared log-ratio term that does not vanish with A; a custom loss is not assumed to."""

CLIPPED_LOSSES = frozenset({"ppo", "dapo", "gspo"})
DUAL_CLIP_LOSSES = frozenset({"ppo", "dapo"})
SAMPLER_ANCHORED_LOSSES = frozenset({"dppo"})
"""Losses whose ratio is taken against the sampler's log-probs (prime-rl's μ) where the batch has them,
rather than the trainer's old-policy snapshot: the ratio is then already the whole IS correction."""

LOSS_AGGREGATIONS: dict[str, str] = {"gspo": "seq-mean-token-mean"}
"""A policy loss's own aggregation where it is not ``DEFAULT_AGGREGATION``: GSPO's objective is
the mean over sequences of per-sequence token means (verl forces it; here it is the default)."""


def default_aggregation(policy_loss: str) -> str:
    """The aggregation mode ``policy_loss`` uses unless one is set: ``seq-mean-token-mean`` for
    ``gspo``, ``token-mean`` for every other loss, custom ones included."""
    return LOSS_AGGREGATIONS.get(policy_loss, DEFAULT_AGGREGATION)
