"""The training objective: configuration, inputs and ``compute_loss``, the trainer's entry point.

The loss is a sum of three per-token components, each normalised over its own tokens (the
nonzero entries of its weight tensor) and then summed (the form prime-rl uses):

    loss = agg(w_rl · L_rl) + token-mean(w_ce · L_ce) + token-mean(w_ref_kl · L_ref_kl)

- ``rl``: the configured policy loss (a ``POLICY_LOSSES`` name or a custom loss, see
  :mod:`~rlvr.backends.train.losses.custom`), times a detached IS weight π_old/π_sampler when
  ``tis_cap`` (truncated) or ``mis_high`` (masked, IcePop) is set, per token or per sequence
  (``is_level``, :func:`~rlvr.backends.train.losses.divergence.sampler_is_weight`), plus
  ``kl_coef · KL(π_θ‖π_ref)`` (``kl_estimator``) and minus ``entropy_coef · H``; aggregated with
  ``LossConfig.aggregation`` (by default the policy loss's own: ``seq-mean-token-mean`` for gspo,
  ``token-mean`` otherwise).
- ``ce``: masked negative log-likelihood −logπ_θ (SFT / distillation from samples).
- ``ref_kl``: the reverse KL to a reference used as a policy-gradient signal (``ref_kl_loss``).

Invariants: NaN/inf at positions outside a component's mask never reach the loss or the gradient
(inputs are selected with ``torch.where`` per component before any arithmetic); NaN/inf at a
member position makes the loss non-finite, for the caller's non-finite guard to catch — it is
never silently zeroed. An empty component contributes 0. Imports torch and, through
:mod:`~rlvr.backends.train.losses.custom`, :mod:`rlvr.envs.loading`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from dataclasses import field as dataclass_field
from typing import Any

import torch
from torch import Tensor

from rlvr.backends.train.losses.aggregation import (
    AGGREGATIONS,
    aggregate,
    masked_mean,
    member,
    zero_outside,
)
from rlvr.backends.train.losses.custom import Scalar, checked_kwargs, is_custom, load_policy_loss
from rlvr.backends.train.losses.divergence import IS_LEVELS, KL_ESTIMATORS, kl_k3, ref_kl_loss, sampler_is_weight
from rlvr.backends.train.losses.policy import (
    CLIPPED_LOSSES,
    DUAL_CLIP_LOSSES,
    POLICY_LOSSES,
    SAMPLER_ANCHORED_LOSSES,
    ZERO_AT_ZERO_ADVANTAGE,
    PolicyLossFn,
    default_aggregation,
)


def masked_nll(logp: Tensor, mask: Tensor) -> Tensor:
    """Token-mean negative log-likelihood over ``mask`` (the ``ce`` component / SFT loss).

    ``logp``: [B,T] log-probs of the target tokens; ``mask``: [B,T] 0/1 float.
    Returns Σ_m(−logp) / max(Σ m, 1), a scalar; 0 (with grad) when the mask is all zero.
    """
    return aggregate(-logp, mask, "token-mean")


def _require(ok: bool, field: str, message: str) -> None:
    if not ok:
        raise ValueError(f"LossConfig.{field}: {message}")


def _finite(value: float | None) -> bool:
    return value is not None and math.isfinite(value)


@dataclass(frozen=True, slots=True)
class LossConfig:
    """Loss hyperparameters. A ``None`` variant field means that variant's own default.

    ``policy_loss`` is a ``POLICY_LOSSES`` name or a custom loss ``package.module:function`` /
    ``path/file.py:function`` (:mod:`~rlvr.backends.train.losses.custom`), resolved once here;
    ``policy_loss_fn`` is the resolved function. ``policy_loss_kwargs`` (scalars) are extra keyword
    arguments for a custom loss only. ``aggregation=None`` resolves here to the policy loss's own
    default (``default_aggregation``: ``seq-mean-token-mean`` for gspo, ``token-mean`` otherwise),
    so ``aggregation`` always reads as a concrete mode (``replace`` then carries that mode over).

    ``tis_cap`` / ``mis_low``, ``mis_high`` / ``is_level``: one IS correction against the sampler
    (truncate or mask), at the token, sequence (geometric mean) or sequence-product level.

    Variant defaults: ppo ε 0.2/0.2; dapo ε 0.2/0.28; gspo ε 3e-4/4e-4; cispo cap 5.0; dro β 0.05;
    dppo masks 0.2/0.2, τ_adv 1, τ_KL 1e-3 (its ratio is against the sampler, so ``tis_cap`` /
    ``mis_high`` are refused with it: they would correct the same mismatch twice).
    Setting a variant field for a loss that does not use it (a custom one included) is an error,
    not a silent no-op. Invalid values raise ``ValueError`` naming ``LossConfig.<field>``.
    """

    policy_loss: str = "grpo"
    aggregation: str | None = None
    constant_normaliser: float | None = None
    clip_eps_low: float | None = None
    clip_eps_high: float | None = None
    dual_clip: float | None = None
    kl_coef: float = 0.0
    kl_estimator: str = "k3"
    entropy_coef: float = 0.0
    tis_cap: float | None = None
    mis_low: float | None = None
    mis_high: float | None = None
    is_level: str = "token"
    dro_beta: float | None = None
    cispo_cap: float | None = None
    dppo_mask_low: float | None = None
    dppo_mask_high: float | None = None
    dppo_adv_tau: float | None = None
    dppo_kl_tau: float | None = None
    policy_loss_kwargs: Mapping[str, Scalar] = dataclass_field(default_factory=dict, hash=False)
    _policy_fn: PolicyLossFn = dataclass_field(init=False, repr=False, compare=False)

    @property
    def rl_aggregation(self) -> str:
        """The rl component's aggregation, resolved (``aggregation`` or the policy loss's own)."""
        assert self.aggregation is not None  # __post_init__ resolves it
        return self.aggregation

    def __post_init__(self) -> None:
        _require(isinstance(self.policy_loss, str), "policy_loss",
                 f"{self.policy_loss!r} is not a loss name or an import spec")
        if self.aggregation is None:
            object.__setattr__(self, "aggregation", default_aggregation(self.policy_loss))
        _require(self.aggregation in AGGREGATIONS, "aggregation",
                 f"{self.aggregation!r} is not one of {list(AGGREGATIONS)}")
        if self.aggregation == "constant":
            _require(self.constant_normaliser is not None and _finite(self.constant_normaliser)
                     and self.constant_normaliser > 0,
                     "constant_normaliser", "aggregation='constant' needs a finite value > 0 "
                     "(e.g. the max completion length)")
        else:
            _require(self.constant_normaliser is None, "constant_normaliser",
                     "only applies to aggregation='constant'; leave it unset")
        self._check_variant_fields()
        _require(_finite(self.kl_coef) and self.kl_coef >= 0, "kl_coef",
                 "must be finite and >= 0")
        _require(self.kl_estimator in KL_ESTIMATORS, "kl_estimator",
                 f"{self.kl_estimator!r} is not one of {sorted(KL_ESTIMATORS)}")
        _require(_finite(self.entropy_coef) and self.entropy_coef >= 0, "entropy_coef",
                 "must be finite and >= 0 (it is a bonus)")
        self._check_is_correction()
        # Last, so a plain config mistake is reported before any user code is imported.
        object.__setattr__(self, "_policy_fn", self._resolve_policy_loss())

    @property
    def policy_loss_fn(self) -> PolicyLossFn:
        """``fn(logp, old_logp, adv, mask, **policy_loss_params()) -> (loss_tokens, diagnostics)``."""
        return self._policy_fn

    @property
    def zero_at_zero_advantage(self) -> bool:
        """Whether a token of advantage 0 adds exactly nothing to the rl component, value and gradient:
        a policy loss of ``ZERO_AT_ZERO_ADVANTAGE``, no KL penalty and no entropy bonus."""
        return self.policy_loss in ZERO_AT_ZERO_ADVANTAGE and self.kl_coef == 0 and self.entropy_coef == 0

    def policy_loss_params(self) -> dict[str, float | None]:
        """The plain values every policy loss receives as ``**params`` (None = the variant's default).

        A custom loss receives this same dict (all None, as variant fields are refused for it) plus
        ``policy_loss_kwargs``.
        """
        return {"clip_eps_low": self.clip_eps_low, "clip_eps_high": self.clip_eps_high, "dual_clip": self.dual_clip,
                "cispo_cap": self.cispo_cap, "dro_beta": self.dro_beta, "dppo_mask_low": self.dppo_mask_low,
                "dppo_mask_high": self.dppo_mask_high, "dppo_adv_tau": self.dppo_adv_tau,
                "dppo_kl_tau": self.dppo_kl_tau}

    def __reduce__(self) -> tuple[Any, ...]:
        # Rebuilt from the settings: a copy, or another process, resolves a custom loss afresh
        # (a function loaded from a file does not pickle).
        settings = {f.name: getattr(self, f.name) for f in fields(self) if f.init}
        return _loss_config, (settings | {"policy_loss_kwargs": dict(self.policy_loss_kwargs)},)

    def _resolve_policy_loss(self) -> PolicyLossFn:
        """The registry entry, or the custom loss loaded once with ``policy_loss_kwargs`` bound."""
        name = self.policy_loss
        if not is_custom(name):
            _require(not self.policy_loss_kwargs, "policy_loss_kwargs", f"only a custom policy loss takes "
                     f"extra keyword arguments; the built-in {name!r} reads its variant fields; leave it unset")
            return POLICY_LOSSES[name]
        params = frozenset(self.policy_loss_params())
        try:
            kwargs = checked_kwargs(self.policy_loss_kwargs, params)
        except ValueError as exc:
            raise ValueError(f"LossConfig.policy_loss_kwargs: {exc}") from None
        object.__setattr__(self, "policy_loss_kwargs", kwargs)
        try:
            return load_policy_loss(name, params, kwargs)
        except ValueError as exc:
            raise ValueError(f"LossConfig.policy_loss: {exc}") from None

    def _check_is_correction(self) -> None:
        if self.tis_cap is not None:
            _require(_finite(self.tis_cap) and self.tis_cap > 0, "tis_cap", "must be finite and > 0")
        if self.mis_high is not None:
            _require(_finite(self.mis_high) and self.mis_high > 0, "mis_high", "must be finite and > 0")
            _require(self.tis_cap is None, "mis_high", "masks the IS weight that tis_cap truncates; set one of them")
        if self.mis_low is not None:
            _require(self.mis_high is not None, "mis_low", "is the lower bound of masked IS: set mis_high too")
            _require(_finite(self.mis_low) and 0 <= self.mis_low < self.mis_high, "mis_low",  # type: ignore[operator]
                     "must be finite, >= 0 and below mis_high")
        _require(self.is_level in IS_LEVELS, "is_level", f"{self.is_level!r} is not one of {list(IS_LEVELS)}")
        _require(self.is_level == "token" or self.tis_cap is not None or self.mis_high is not None, "is_level",
                 "is the level of an IS correction: set tis_cap or mis_high")

    def _check_variant_fields(self) -> None:
        name = self.policy_loss
        hint = "; a custom loss takes its settings from policy_loss_kwargs" if is_custom(name) else ""
        for field_name, users in (("clip_eps_low", CLIPPED_LOSSES), ("clip_eps_high", CLIPPED_LOSSES),
                                  ("dual_clip", DUAL_CLIP_LOSSES), ("dro_beta", {"dro"}),
                                  ("cispo_cap", {"cispo"}), ("dppo_mask_low", {"dppo"}),
                                  ("dppo_mask_high", {"dppo"}), ("dppo_adv_tau", {"dppo"}),
                                  ("dppo_kl_tau", {"dppo"})):
            if getattr(self, field_name) is not None:
                _require(name in users, field_name, f"is not used by policy_loss={name!r} "
                         f"(only by {sorted(users)}); leave it unset{hint}")
        if self.clip_eps_low is not None:
            _require(_finite(self.clip_eps_low) and 0 < self.clip_eps_low < 1, "clip_eps_low",
                     "must be in (0, 1)")
        if self.clip_eps_high is not None:
            _require(_finite(self.clip_eps_high) and self.clip_eps_high > 0, "clip_eps_high",
                     "must be finite and > 0")
        if self.dual_clip is not None:
            _require(_finite(self.dual_clip) and self.dual_clip > 1, "dual_clip", "must be > 1")
        if self.dro_beta is not None:
            _require(_finite(self.dro_beta) and self.dro_beta > 0, "dro_beta", "must be > 0")
        if self.cispo_cap is not None:
            _require(_finite(self.cispo_cap) and self.cispo_cap >= 1, "cispo_cap",
                     "is an absolute cap on the ratio and must be >= 1 (e.g. 5.0), not an epsilon")
        for knob in ("dppo_mask_low", "dppo_mask_high", "dppo_adv_tau"):
            value = getattr(self, knob)
            if value is not None:
                _require(_finite(value) and value > 0, knob, "must be finite and > 0")
        if self.dppo_kl_tau is not None:
            _require(_finite(self.dppo_kl_tau) and self.dppo_kl_tau >= 0, "dppo_kl_tau", "must be finite and >= 0")
        if name in SAMPLER_ANCHORED_LOSSES:
            for knob in ("tis_cap", "mis_high"):
                _require(getattr(self, knob) is None, knob, f"policy_loss={name!r} takes its ratio against the "
                         "sampler's log-probs, which already corrects for the sampler; leave it unset")


def _loss_config(settings: dict[str, Any]) -> LossConfig:
    return LossConfig(**settings)


@dataclass
class LossInputs:
    """Per-token streams, all [B,T] over completion positions, aligned by the caller.

    ``old_logp`` None means on-policy (``logp.detach()``, ratio 1). A weight tensor selects its
    component's tokens (nonzero = member) and scales their loss; ``None`` = component absent.
    ``ref_logp`` is the frozen reference of the rl component's KL penalty (``kl_coef``);
    ``ref_kl_logp`` the reference the ``ref_kl`` component distils from (a teacher, or the policy
    shown a demonstration). ``denominators`` (``{"rl", "ce", "ref_kl"}``, not a tensor) replaces
    each component's own count (rl tokens or sequences, ce tokens, ref_kl tokens) by a count over
    more than this batch: the trainer passes its minibatch's, so micro-batch losses add up to it.
    """

    logp: Tensor
    old_logp: Tensor | None
    advantages: Tensor
    rl_weight: Tensor
    ce_weight: Tensor | None = None
    ref_kl_weight: Tensor | None = None
    ref_logp: Tensor | None = None
    sampler_logp: Tensor | None = None
    entropy: Tensor | None = None
    ref_kl_logp: Tensor | None = None
    denominators: dict[str, float] | None = None


@dataclass(frozen=True, slots=True)
class LossOutput:
    """``loss``: scalar with grad. ``metrics``: floats.

    ``loss/total``, ``loss/rl``, ``loss/ce``, ``loss/ref_kl`` are the components; ``train/*`` are
    means over rl tokens: ``ppo_kl`` = mean(exp(d) − d − 1) with d = logp − old (≥ 0), ``clip_frac``
    (0 for unclipped losses) and the variant's other diagnostics, plus, when their inputs are given, ``kl`` (the
    configured estimator vs the reference), ``entropy``, ``mismatch_kl`` (k3 of the sampler vs
    the old policy), ``tis_weight`` and ``tis_clip_frac`` (truncated IS: the mean weight, the
    fraction of rl tokens whose ratio was above the cap) or ``mis_weight`` and ``mis_masked_frac``
    (masked IS: the mean weight, masked tokens counted as 0, and the fraction masked; at a sequence
    level a row's tokens share its weight, so these are token-weighted over rows).
    """

    loss: Tensor
    metrics: dict[str, float]


def _prepared(x: LossInputs, cfg: LossConfig) -> LossInputs:
    """Check shapes and cross-field needs; upcast half-precision streams to float32."""
    if x.logp.dim() != 2:
        raise ValueError(f"LossInputs.logp must be [B,T], got shape {tuple(x.logp.shape)}")
    updates = {}
    for f in fields(x):
        t = getattr(x, f.name)
        if t is None or f.name == "denominators":
            continue
        if t.shape != x.logp.shape:
            raise ValueError(f"LossInputs.{f.name} has shape {tuple(t.shape)}; expected "
                             f"{tuple(x.logp.shape)} like LossInputs.logp")
        if t.dtype in (torch.float16, torch.bfloat16):
            updates[f.name] = t.float()
    needs = (("kl_coef > 0", cfg.kl_coef > 0, "ref_logp"),
             ("ref_kl_weight", x.ref_kl_weight is not None, "ref_kl_logp"),
             ("tis_cap", cfg.tis_cap is not None, "sampler_logp"),
             ("mis_high", cfg.mis_high is not None, "sampler_logp"),
             ("entropy_coef > 0", cfg.entropy_coef > 0, "entropy"))
    for what, active, field in needs:
        if active and getattr(x, field) is None:
            raise ValueError(f"{what} needs LossInputs.{field}; pass it or turn {what} off")
    return replace(x, **updates)


def _rl_component(x: LossInputs, cfg: LossConfig) -> tuple[Tensor, dict[str, Tensor]]:
    """Aggregated rl loss and its per-token statistics (means over rl tokens)."""
    keep = member(x.rl_weight)
    logp = zero_outside(x.logp, keep)
    old = logp.detach() if x.old_logp is None else zero_outside(x.old_logp, keep).detach()
    adv = zero_outside(x.advantages, keep)
    anchor = old
    if cfg.policy_loss in SAMPLER_ANCHORED_LOSSES and x.sampler_logp is not None:
        anchor = zero_outside(x.sampler_logp, keep).detach()  # prime-rl's μ: the policy that sampled
    tokens, diag = cfg.policy_loss_fn(logp, anchor, adv, keep, **cfg.policy_loss_params())
    stats = {"train/clip_frac": torch.zeros_like(logp)}
    stats.update({f"train/{k}": v for k, v in diag.items()})
    # k3 of the live policy against the step-start snapshot, d = logp − old: exp(d) − d − 1 is ≥ 0
    # per token (k1, old − logp, averages below 0 once minibatches drift), and exactly 0 where the
    # policy has not moved. Unclamped: it is a diagnostic, never a loss term.
    drift = logp.detach() - old
    stats["train/ppo_kl"] = torch.expm1(drift) - drift
    if x.sampler_logp is not None:
        sampler = zero_outside(x.sampler_logp, keep)
        stats["train/mismatch_kl"] = kl_k3(sampler, old)
        if cfg.tis_cap is not None or cfg.mis_high is not None:
            weight, flag = sampler_is_weight(old, sampler, keep, level=cfg.is_level, cap=cfg.tis_cap,
                                             low=cfg.mis_low, high=cfg.mis_high)
            tokens = tokens * weight
            name = "tis" if cfg.tis_cap is not None else "mis"
            stats[f"train/{name}_weight"] = weight
            stats["train/tis_clip_frac" if name == "tis" else "train/mis_masked_frac"] = flag
    if x.ref_logp is not None:
        kl = KL_ESTIMATORS[cfg.kl_estimator](logp, zero_outside(x.ref_logp, keep))
        stats["train/kl"] = kl
        if cfg.kl_coef > 0:
            tokens = tokens + cfg.kl_coef * kl
    if x.entropy is not None:
        entropy = zero_outside(x.entropy, keep)
        stats["train/entropy"] = entropy
        if cfg.entropy_coef > 0:
            tokens = tokens - cfg.entropy_coef * entropy
    loss = aggregate(tokens * x.rl_weight, keep, cfg.rl_aggregation, cfg.constant_normaliser,
                     denominator=_denominator(x, "rl"))
    return loss, {k: masked_mean(v.detach(), keep) for k, v in stats.items()}


def _ce_component(x: LossInputs) -> Tensor:
    if x.ce_weight is None:
        return x.logp.new_zeros(())
    keep = member(x.ce_weight)
    return aggregate(-zero_outside(x.logp, keep) * x.ce_weight, keep, "token-mean", denominator=_denominator(x, "ce"))


def _ref_kl_component(x: LossInputs) -> Tensor:
    if x.ref_kl_weight is None:
        return x.logp.new_zeros(())
    assert x.ref_kl_logp is not None  # checked with the inputs (``needs``)
    keep = member(x.ref_kl_weight)
    logp = zero_outside(x.logp, keep)
    old = logp if x.old_logp is None else zero_outside(x.old_logp, keep)
    tokens = ref_kl_loss(logp, old, zero_outside(x.ref_kl_logp, keep))
    return aggregate(tokens * x.ref_kl_weight, keep, "token-mean", denominator=_denominator(x, "ref_kl"))


def _denominator(x: LossInputs, component: str) -> float | None:
    return None if x.denominators is None else x.denominators[component]


def compute_loss(inputs: LossInputs, cfg: LossConfig) -> LossOutput:
    """Total loss = rl + ce + ref_kl (see the module docstring), with float metrics.

    rl is aggregated with ``cfg.aggregation``; ce and ref_kl are always token-means over their
    own tokens (with 0/1 weights, ce equals ``masked_nll``). Raises ``ValueError`` naming the
    field for mismatched shapes or a missing stream the config needs (e.g. ``kl_coef > 0``
    without ``ref_logp``).
    """
    x = _prepared(inputs, cfg)
    rl, stats = _rl_component(x, cfg)
    ce = _ce_component(x)
    ref_kl = _ref_kl_component(x)
    loss = rl + ce + ref_kl
    named = {"loss/total": loss, "loss/rl": rl, "loss/ce": ce, "loss/ref_kl": ref_kl, **stats}
    # One device sync for all metrics rather than one .item() per entry.
    values = torch.stack([v.detach().float().reshape(()) for v in named.values()]).tolist()
    return LossOutput(loss=loss, metrics=dict(zip(named, values, strict=True)))
