"""Tests for rlvr.backends.train.losses: hand-computed values, gradients, aggregation, NaN handling.

Expected values are computed by hand from each formula (KL with Δ = logπ − logπ_ref); values
taken from other projects' unit tests name the project.
"""

from __future__ import annotations

import math

import pytest

pytestmark = pytest.mark.train
torch = pytest.importorskip("torch")

from rlvr.backends.train.losses import (  # noqa: E402
    KL_ESTIMATORS,
    POLICY_LOSSES,
    LossConfig,
    LossInputs,
    aggregate,
    cispo,
    compute_loss,
    dapo,
    dro,
    entropy_from_logits,
    grpo,
    gspo,
    importance_sampling,
    kl_k1,
    kl_k2,
    kl_k3,
    masked_nll,
    ppo,
    ref_kl_loss,
    reinforce,
    tis_weight,
)
from rlvr.backends.train.losses.policy import SAMPLER_ANCHORED_LOSSES  # noqa: E402

NAN, INF = float("nan"), float("inf")


def t(rows, grad: bool = False):
    """A float64 tensor from nested lists (1-D lists become one row)."""
    if rows and not isinstance(rows[0], list):
        rows = [rows]
    return torch.tensor(rows, dtype=torch.float64, requires_grad=grad)


def grad_of(scalar, x):
    (g,) = torch.autograd.grad(scalar, x)
    return g


def close(actual, expected, tol: float = 1e-6) -> None:
    torch.testing.assert_close(actual, t(expected), rtol=0, atol=tol)


def inputs(logp, adv, rl_weight=None, **extra) -> LossInputs:
    rl_weight = torch.ones_like(logp) if rl_weight is None else rl_weight
    return LossInputs(logp=logp, old_logp=extra.pop("old_logp", None), advantages=adv,
                      rl_weight=rl_weight, **extra)


# ---- masked_nll ---------------------------------------------------------------------------------


def test_masked_nll_is_token_mean_over_mask():
    logp = t([[-1.0, -2.0, -3.0], [-4.0, -5.0, -6.0]], grad=True)
    loss = masked_nll(logp, t([[1, 1, 0], [0, 0, 1]]))
    assert loss.item() == pytest.approx((1 + 2 + 6) / 3)
    close(grad_of(loss, logp), [[-1 / 3, -1 / 3, 0], [0, 0, -1 / 3]])


def test_masked_nll_all_zero_mask_is_zero_with_grad():
    logp = t([[-1.0, NAN]], grad=True)
    loss = masked_nll(logp, t([[0, 0]]))
    assert loss.item() == 0.0 and loss.requires_grad
    close(grad_of(loss, logp), [[0.0, 0.0]])


# ---- policy losses: values and gradients --------------------------------------------------------


def test_reinforce_value_and_gradient():
    logp = t([-0.5, -2.0], grad=True)
    loss, _ = reinforce(logp, t([2.0, -1.0]))
    close(loss, [[1.0, -2.0]])
    close(grad_of(loss.sum(), logp), [[-2.0, 1.0]])  # −A


def test_importance_sampling_value_and_gradient():
    # ℓ = [0.5, −0.5] against old = 0; L = −ρA, dL/dlogp = −ρA.
    logp = t([0.5, -0.5], grad=True)
    loss, _ = importance_sampling(logp, t([0.0, 0.0]), t([1.0, -1.0]))
    close(loss, [[-1.648721, 0.606531]])
    close(grad_of(loss.sum(), logp), [[-1.648721, 0.606531]])


def test_grpo_on_policy_value_is_minus_adv_and_gradient_is_reinforce():
    logp = t([-1.3, -0.2], grad=True)
    adv = t([0.5, -2.0])
    loss, _ = grpo(logp, logp.detach(), adv)
    close(loss, [[-0.5, 2.0]])  # ratio 1 in value
    close(grad_of(loss.sum(), logp), [[-0.5, 2.0]])  # == REINFORCE gradient −A∇logp


def test_grpo_off_policy_equals_importance_sampling():
    logp, old, adv = t([-0.7, -1.9]), t([-1.0, -1.5]), t([1.5, -0.5])
    torch.testing.assert_close(grpo(logp, old, adv)[0], importance_sampling(logp, old, adv)[0])
    close(grpo(logp, old, adv)[0], [[-1.5 * math.exp(0.3), 0.5 * math.exp(-0.4)]])


# Hand-computed PPO vectors (ε = 0.2, c = 3): (A, ℓ) → loss.
PPO_ELL = [0.5, -0.5, 0.5, -0.5, 1.5]
PPO_ADV = [1.0, 1.0, -1.0, -1.0, -1.0]


def test_ppo_matches_worked_vectors_and_clip_indicators():
    loss, diag = ppo(t(PPO_ELL), t([0.0] * 5), t(PPO_ADV))
    close(loss, [[-1.2, -0.606531, 1.648721, 0.8, 4.481689]])
    close(diag["clip_frac"].double(), [[1, 0, 0, 1, 0]])
    close(diag["clip_frac_low"].double(), [[0, 0, 0, 1, 0]])
    close(diag["clip_frac_high"].double(), [[1, 0, 0, 0, 0]])
    assert "dual_clip_frac" not in diag


def test_ppo_dual_clip_bounds_negative_advantage():
    loss, diag = ppo(t(PPO_ELL), t([0.0] * 5), t(PPO_ADV), dual_clip=3.0)
    close(loss, [[-1.2, -0.606531, 1.648721, 0.8, 3.0]])
    close(diag["dual_clip_frac"].double(), [[0, 0, 0, 0, 1]])


def test_ppo_gradient_is_zero_on_clipped_tokens():
    logp = t(PPO_ELL, grad=True)
    loss, _ = ppo(logp, t([0.0] * 5), t(PPO_ADV), dual_clip=3.0)
    # unclipped tokens: −Aρ; clipped and dual-clipped tokens: 0.
    close(grad_of(loss.sum(), logp), [[0.0, -0.606531, 1.648721, 0.0, 0.0]])


def test_dapo_clips_higher_than_ppo():
    # ρ = e^0.26 = 1.296930 lies between 1.2 (ppo) and 1.28 (dapo); e^0.3 = 1.349859 above both.
    logp, old, adv = t([0.26, 0.3, -0.5]), t([0.0, 0.0, 0.0]), t([1.0, 1.0, -1.0])
    close(ppo(logp, old, adv)[0], [[-1.2, -1.2, 0.8]])
    close(dapo(logp, old, adv)[0], [[-1.28, -1.28, 0.8]])
    close(dapo(t([0.24]), t([0.0]), t([1.0]))[0], [[-math.exp(0.24)]])  # 1.271249 < 1.28


def test_gspo_uses_length_normalised_sequence_ratio_per_token():
    # row 0: ℓ = [0.1, 0.3, masked NaN] → s = e^0.2; row 1: ℓ = [−0.2, 0, 0.2] → s = 1.
    logp = t([[-1.0, -0.7, 0.0], [-0.4, -1.0, -0.8]], grad=True)
    old = t([[-1.1, -1.0, NAN], [-0.2, -1.0, -1.0]])
    adv = t([[1.0, 1.0, 1.0], [-1.0, -1.0, -1.0]])
    mask = t([[1, 1, 0], [1, 1, 1]])
    s = math.exp(0.2)
    loss, diag = gspo(logp, old, adv, mask, eps_low=0.5, eps_high=0.5)
    close(loss[:, :2], [[-s, -s], [1.0, 1.0]])
    # stop-grad form: d L_{i,t} / d logp_{i,t} = −A s_i, no cross-token terms.
    close(grad_of((loss * mask).sum(), logp), [[-s, -s, 0.0], [1.0, 1.0, 1.0]])
    close(diag["clip_frac"].double() * mask, [[0, 0, 0], [0, 0, 0]])


def test_gspo_default_epsilons_clip_the_sequence_ratio():
    logp = t([[-1.0, -0.7]], grad=True)
    loss, diag = gspo(logp, t([[-1.1, -1.0]]), t([[1.0, 1.0]]), t([[1, 1]]))
    close(loss, [[-1.0004, -1.0004]])  # clip(e^0.2, 1 − 3e-4, 1 + 4e-4)
    close(diag["clip_frac"].double(), [[1, 1]])
    close(grad_of(loss.sum(), logp), [[0.0, 0.0]])


def test_gspo_token_form_gradient_matches_sequence_objective_under_seq_mean():
    # with sequence-level A and seq-mean-token-mean, the stop-grad form
    # gives the gradient of −mean_i A_i exp(mean_t ℓ_{i,t}).
    logp = t([[-1.0, -0.7, -2.0], [-0.4, -1.0, -0.8]], grad=True)
    old = t([[-1.1, -1.0, -1.5], [-0.2, -1.0, -1.0]])
    adv = t([[0.7, 0.7, 0.7], [-1.2, -1.2, -1.2]])
    mask = t([[1, 1, 0], [1, 1, 1]])
    loss, _ = gspo(logp, old, adv, mask, eps_low=0.9, eps_high=9.0)
    ours = grad_of(aggregate(loss, mask, "seq-mean-token-mean"), logp)
    mean_ell = ((logp - old) * mask).sum(-1) / mask.sum(-1)
    direct = -(adv[:, 0] * torch.exp(mean_ell)).mean()
    torch.testing.assert_close(ours, grad_of(direct, logp))


def test_cispo_value_and_gradient_through_logp_only():
    # ρ = [e^0.1, e^2] → w = [1.105171, 5.0] (cap 5); L = −w A logp; dL/dlogp = −w A.
    logp = t([-1.0, -0.5], grad=True)
    old = t([-1.1, -2.5])
    loss, diag = cispo(logp, old, t([1.0, -1.0]), cap=5.0)
    close(loss, [[1.105171, -2.5]])
    close(grad_of(loss.sum(), logp), [[-1.105171, 5.0]])
    close(diag["clip_frac"].double(), [[0, 1]])


def test_dro_worked_vector_and_gradient():
    # Hand-computed: logπ = −0.8, old = −1.0, A = 2, β = 0.05 ⇒ 1.601; verl's test vector token-mean.
    logp = t([-0.8, -0.9, -0.1], grad=True)
    old, adv, mask = t([-1.0, -0.7, -0.2]), t([2.0, -1.5, 9.0]), t([1, 1, 0])
    loss, _ = dro(logp, old, adv, beta=0.05)
    close(loss[:, :2], [[1.601, -1.349]])
    assert aggregate(loss, mask).item() == pytest.approx((1.601 - 1.349) / 2)
    # dL/dlogp = −A + β(logp − old)
    close(grad_of((loss * mask).sum(), logp), [[-1.99, 1.49, 0.0]])


def test_every_policy_loss_has_the_reinforce_gradient_on_policy():
    # At ratio 1 every variant's gradient is −A ∇logp (ppo/gspo unclipped at ρ = 1, cispo w = 1,
    # dro's quadratic has zero slope), so the token-mean gradient is −A / N.
    logp = t([[-1.0, -0.5, -2.0]], grad=True)
    adv = t([[1.5, -0.5, 2.0]])
    for name in POLICY_LOSSES:
        out = compute_loss(inputs(logp, adv), LossConfig(policy_loss=name))
        close(grad_of(out.loss, logp), [[-0.5, 0.5 / 3, -2.0 / 3]])


def test_registries_name_every_variant():
    assert set(POLICY_LOSSES) == {"grpo", "ppo", "dapo", "gspo", "cispo", "importance_sampling",
                                  "reinforce", "dro", "dppo"}
    assert set(KL_ESTIMATORS) == {"k1", "k2", "k3"}


def test_config_variant_fields_reach_the_loss():
    logp, adv = t([[0.5]]), t([[1.0]])
    old = t([[0.0]])
    run = lambda cfg: compute_loss(inputs(logp, adv, old_logp=old), cfg).loss.item()  # noqa: E731
    assert run(LossConfig(policy_loss="ppo")) == pytest.approx(-1.2)
    assert run(LossConfig(policy_loss="ppo", clip_eps_high=0.7)) == pytest.approx(-math.exp(0.5))
    assert run(LossConfig(policy_loss="dapo")) == pytest.approx(-1.28)
    assert run(LossConfig(policy_loss="cispo", cispo_cap=1.5)) == pytest.approx(-1.5 * 0.5)
    assert run(LossConfig(policy_loss="dro", dro_beta=2.0)) == pytest.approx(-(0.5 - 0.25))


# ---- KL, reverse-KL signal, TIS, entropy --------------------------------------------------------


def test_kl_estimators_match_worked_vectors():
    # Hand-computed: logπ = [−1.0, −0.5], logπ_ref = [−1.2, −0.1] (Δ = logπ − logπ_ref = [0.2, −0.4]).
    logp, ref = t([-1.0, -0.5]), t([-1.2, -0.1])
    close(kl_k1(logp, ref), [[0.2, -0.4]])
    close(kl_k2(logp, ref), [[0.02, 0.08]])
    close(kl_k3(logp, ref), [[0.018731, 0.091825]])


def test_kl_estimator_gradients():
    logp, ref = t([-1.0, -0.5], grad=True), t([-1.2, -0.1])
    close(grad_of(kl_k1(logp, ref).sum(), logp), [[1.0, 1.0]])
    close(grad_of(kl_k2(logp, ref).sum(), logp), [[0.2, -0.4]])  # Δ
    close(grad_of(kl_k3(logp, ref).sum(), logp), [[1 - math.exp(-0.2), 1 - math.exp(0.4)]])


def test_k3_is_the_plain_formula_inside_its_clamps():
    # Δ in (−2.6, 11): neither the ±20 clamp on Δ nor the 10 clamp on k3 is active.
    logp = t([-2.5, -1.0, -0.1, 0.0, 0.5, 3.0, 10.5], grad=True)
    ref = t([0.0] * 7)
    clamped, plain = kl_k3(logp, ref), kl_k3(logp, ref, clamp=False)
    assert clamped.max().item() < 10
    torch.testing.assert_close(clamped, plain, rtol=0, atol=1e-12)
    torch.testing.assert_close(grad_of(clamped.sum(), logp), grad_of(plain.sum(), logp), rtol=0, atol=1e-12)


def test_k3_is_finite_and_clamped_for_extreme_log_ratios():
    # verl's low_var_kl: Δ clamped to [−20, 20] before exp, k3 to [−10, 10]; Δ = −50 gives 10, not e^50.
    logp = t([-50.0, -1e4, 50.0, 1e4], grad=True)
    ref = t([0.0] * 4)
    value = kl_k3(logp, ref)
    close(value, [[10.0, 10.0, 10.0, 10.0]])
    grad = grad_of(value.sum(), logp)
    assert torch.isfinite(grad).all()
    close(grad, [[0.0, 0.0, 0.0, 0.0]])  # beyond the clamps the penalty has no gradient
    assert not torch.isfinite(kl_k3(t([-1e4]), t([0.0]), clamp=False)).all()  # what the clamp prevents
    assert KL_ESTIMATORS["k3"] is kl_k3 and LossConfig().kl_estimator == "k3"  # the default is the clamped one


def test_k3_clamp_keeps_a_nan_at_a_trained_position_visible():
    assert torch.isnan(kl_k3(t([NAN]), t([0.0]))).all()


def test_kl_penalty_adds_k3_gradient_to_rl_component():
    # fw cookbook test: grad = β(1 − exp(ref − π)),
    # π = [−1, −1], ref = [−2, −0.5], β = 0.2.
    logp = t([-1.0, -1.0], grad=True)
    cfg = LossConfig(aggregation="seq-mean-token-sum", kl_coef=0.2)
    out = compute_loss(inputs(logp, t([0.0, 0.0]), ref_logp=t([-2.0, -0.5])), cfg)
    close(grad_of(out.loss, logp), [[0.2 * (1 - math.exp(-1)), 0.2 * (1 - math.exp(0.5))]])
    k3 = [math.exp(-1) + 1 - 1, math.exp(0.5) - 0.5 - 1]  # Δ = [1, −0.5]
    assert out.metrics["train/kl"] == pytest.approx(sum(k3) / 2)


def test_ref_kl_loss_is_sampled_reverse_kl_on_policy():
    # fw OPD test: teacher [−0.2, −1, −0.3], sampling [−0.5, −0.8, −0.7];
    # value = logπ − logπ_ref, gradient = logπ − logπ_ref.
    logp = t([-0.5, -0.8, -0.7], grad=True)
    loss = ref_kl_loss(logp, logp.detach(), t([-0.2, -1.0, -0.3]))
    close(loss, [[-0.3, 0.2, -0.4]])
    close(grad_of(loss.sum(), logp), [[-0.3, 0.2, -0.4]])


def test_tis_weight_truncates_and_is_detached():
    # verl rollout-corr test: old = −2, rollout −1 / −2.5 ⇒ 0.368 / 1.649 (cap 2, untouched).
    weight, truncated = tis_weight(t([-2.0, -2.0]), t([-1.0, -2.5]), cap=2.0)
    close(weight, [[math.exp(-1), math.exp(0.5)]])
    close(truncated.double(), [[0, 0]])
    weight, truncated = tis_weight(t([0.0]), t([-1.0]), cap=1.5)
    close(weight, [[1.5]])
    close(truncated.double(), [[1]])
    assert not tis_weight(t([0.0], grad=True), t([-1.0]), cap=1.5)[0].requires_grad


def test_tis_multiplies_policy_loss_but_not_kl():
    # fw test: A = 2, old = 0, sampler = −1, cap 1.5 ⇒ effective advantage 3.0.
    logp = t([0.0, 0.0], grad=True)
    cfg = LossConfig(aggregation="seq-mean-token-sum", tis_cap=1.5, kl_coef=0.5)
    out = compute_loss(inputs(logp, t([2.0, 2.0]), sampler_logp=t([-1.0, -1.0]),
                              ref_logp=t([0.0, -1.0])), cfg)
    k3 = math.exp(-1) + 1 - 1  # Δ = 1 on token 2
    assert out.loss.item() == pytest.approx(-6.0 + 0.5 * k3)
    close(grad_of(out.loss, logp), [[-3.0, -3.0 + 0.5 * (1 - math.exp(-1))]])
    assert out.metrics["train/tis_clip_frac"] == 1.0
    assert out.metrics["train/tis_weight"] == pytest.approx(1.5)
    assert out.metrics["train/mismatch_kl"] == pytest.approx(math.exp(1) - 2)  # k3 with Δ = −1


def test_entropy_from_logits_known_values():
    logits = t([[[0.0, 0.0, 0.0, 0.0], [0.0, math.log(3.0), -INF, -INF]]])
    logits.requires_grad_(True)
    h = entropy_from_logits(logits)
    expected = -(0.25 * math.log(0.25) + 0.75 * math.log(0.75))
    torch.testing.assert_close(h, torch.tensor([[math.log(4.0), expected]]), rtol=0, atol=1e-6)
    h.sum().backward()
    assert torch.isfinite(logits.grad).all()


def test_entropy_bonus_is_subtracted_over_rl_tokens():
    logp = t([[-1.0, -2.0, -3.0]], grad=True)
    entropy = t([[1.0, 2.0, NAN]], grad=True)
    rl_weight = t([[1, 1, 0]])
    cfg = LossConfig(entropy_coef=0.1)
    out = compute_loss(inputs(logp, t([[1.0, 1.0, 1.0]]), rl_weight, entropy=entropy), cfg)
    assert out.loss.item() == pytest.approx(-1.0 - 0.1 * 1.5)
    assert out.metrics["train/entropy"] == pytest.approx(1.5)
    close(grad_of(out.loss, entropy), [[-0.05, -0.05, 0.0]])


# ---- aggregation --------------------------------------------------------------------------------

RAGGED_LOSS = [[1.0, 2.0, 3.0], [4.0, 5.0, 6.0], [NAN, INF, 9.0]]
RAGGED_MASK = [[1, 1, 1], [1, 0, 0], [0, 0, 0]]  # lengths 3, 1, 0


@pytest.mark.parametrize(
    ("mode", "constant", "expected"),
    [
        ("token-mean", None, (6 + 4) / 4),
        ("seq-mean-token-mean", None, (2 + 4) / 2),  # the empty row is not a sequence
        ("seq-mean-token-sum", None, (6 + 4) / 2),
        ("constant", 4.0, (6 + 4) / 2 / 4),
    ],
)
def test_aggregation_modes_on_ragged_mask(mode, constant, expected):
    loss = t(RAGGED_LOSS, grad=True)
    value = aggregate(loss, t(RAGGED_MASK), mode, constant)
    assert value.item() == pytest.approx(expected)
    assert torch.isfinite(grad_of(value, loss)).all()


@pytest.mark.parametrize(
    "mode", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "constant"]
)
def test_aggregation_of_empty_mask_is_zero_with_grad(mode):
    loss = t([[NAN, 1.0], [2.0, INF]], grad=True)
    value = aggregate(loss, t([[0, 0], [0, 0]]), mode, 8.0 if mode == "constant" else None)
    assert value.item() == 0.0
    close(grad_of(value, loss), [[0.0, 0.0], [0.0, 0.0]])


def test_aggregation_rejects_bad_mode_and_missing_constant():
    with pytest.raises(ValueError, match="sum-of-everything"):
        aggregate(t([[1.0]]), t([[1]]), "sum-of-everything")
    with pytest.raises(ValueError, match="constant"):
        aggregate(t([[1.0]]), t([[1]]), "constant")


def test_constant_aggregation_through_compute_loss():
    logp = t([[-1.0, -1.0, -1.0], [-1.0, -1.0, -1.0]], grad=True)
    adv = t([[1.0, 1.0, 1.0], [2.0, 2.0, 2.0]])
    cfg = LossConfig(aggregation="constant", constant_normaliser=10.0)
    out = compute_loss(inputs(logp, adv, t([[1, 1, 1], [1, 0, 0]])), cfg)
    assert out.loss.item() == pytest.approx(-(3.0 + 2.0) / 2 / 10.0)


# ---- components ---------------------------------------------------------------------------------


def test_components_are_each_normalised_by_their_own_tokens():
    logp = t([[-1.0, -2.0, -3.0, -4.0]], grad=True)
    out = compute_loss(
        inputs(logp, t([[1.0, 2.0, 3.0, 0.0]]), t([[1, 1, 1, 0]]), ce_weight=t([[0, 0, 0, 1]])),
        LossConfig(),
    )
    # rl = −(1 + 2 + 3)/3 over its 3 tokens; ce = 4/1 over its 1 token (not (−6 + 4)/4 jointly).
    assert out.metrics["loss/rl"] == pytest.approx(-2.0)
    assert out.metrics["loss/ce"] == pytest.approx(4.0)
    assert out.loss.item() == pytest.approx(2.0)
    close(grad_of(out.loss, logp), [[-1 / 3, -2 / 3, -1.0, -1.0]])


def test_ce_component_equals_masked_nll_and_weights_scale_tokens():
    logp = t([[-1.0, -2.0, -3.0]])
    ce = t([[1, 0, 1]])
    x = inputs(logp, torch.zeros_like(logp), t([[0, 0, 0]]), ce_weight=ce)
    out = compute_loss(x, LossConfig())
    assert out.loss.item() == pytest.approx(masked_nll(logp, ce).item())
    weighted = compute_loss(inputs(logp, t([[1.0, 1.0, 1.0]]), t([[0.5, 1, 0]])), LossConfig())
    assert weighted.loss.item() == pytest.approx(-(0.5 + 1.0) / 2)


def test_ref_kl_component_uses_its_own_mask():
    logp = t([[-0.5, -0.8, -0.7]], grad=True)
    out = compute_loss(
        inputs(logp, t([[0.0, 0.0, 0.0]]), t([[1, 0, 0]]), ref_kl_weight=t([[0, 1, 1]]),
               ref_kl_logp=t([[-0.2, -1.0, -0.3]])),
        LossConfig(),
    )
    assert out.metrics["loss/ref_kl"] == pytest.approx((0.2 - 0.4) / 2)
    close(grad_of(out.loss, logp), [[0.0, 0.1, -0.2]])


def test_empty_rl_component_contributes_zero_with_grad():
    logp = t([[-1.0, -2.0]], grad=True)
    out = compute_loss(inputs(logp, t([[5.0, 5.0]]), t([[0, 0]])), LossConfig(policy_loss="ppo"))
    assert out.loss.item() == 0.0
    close(grad_of(out.loss, logp), [[0.0, 0.0]])


def test_metrics_report_ppo_kl_and_clip_fraction_over_rl_tokens():
    logp = t([[0.5, -0.5, 0.1, 7.0]], grad=True)
    old = t([[0.0, 0.0, 0.0, NAN]])
    out = compute_loss(inputs(logp, t([[1.0, -1.0, 1.0, 1.0]]), t([[1, 1, 1, 0]]), old_logp=old),
                       LossConfig(policy_loss="ppo"))
    # d = logp − old per rl token: 0.5, −0.5, 0.1; ppo_kl = mean(exp(d) − d − 1), the masked token ignored.
    expected = sum(math.exp(d) - d - 1 for d in (0.5, -0.5, 0.1)) / 3
    assert out.metrics["train/ppo_kl"] == pytest.approx(expected, rel=1e-6)
    assert out.metrics["train/clip_frac"] == pytest.approx(2 / 3)
    assert out.metrics["train/clip_frac_low"] == pytest.approx(1 / 3)
    assert out.metrics["train/clip_frac_high"] == pytest.approx(1 / 3)


def test_ppo_kl_is_never_negative_and_zero_only_when_the_policy_did_not_move():
    # k1 (old − logp) averages to −0.1 here: drift that raised more mass than it lowered.
    logp = t([[0.3, -0.1, 0.1, 0.0]], grad=True)
    old = t([[0.0, 0.0, 0.0, 0.0]])
    cfg = LossConfig(policy_loss="ppo")
    moved = compute_loss(inputs(logp, t([[1.0, 1.0, -1.0, 1.0]]), old_logp=old), cfg).metrics["train/ppo_kl"]
    assert moved > 0
    gen = torch.Generator().manual_seed(0)
    for _ in range(20):
        live = torch.randn(3, 7, generator=gen, dtype=torch.float64) - 2
        snap = live + 0.3 * torch.randn(3, 7, generator=gen, dtype=torch.float64)
        adv = torch.randn(3, 7, generator=gen, dtype=torch.float64)
        assert compute_loss(inputs(live, adv, old_logp=snap), cfg).metrics["train/ppo_kl"] >= 0
    same = t([[-1.5, -0.2, -3.0]])
    assert compute_loss(inputs(same, t([[1.0, -1.0, 1.0]]), old_logp=same.clone()), cfg).metrics["train/ppo_kl"] == 0.0


def test_half_precision_inputs_are_computed_in_float32():
    logp = torch.tensor([[-1.0, -2.0]], dtype=torch.bfloat16, requires_grad=True)
    out = compute_loss(inputs(logp, torch.ones_like(logp)), LossConfig())
    assert out.loss.dtype == torch.float32
    assert out.loss.item() == pytest.approx(-1.0)


# ---- non-finite inputs --------------------------------------------------------------------------


def _dirty_and_clean(dirt: float):
    mask = t([[1, 1, 0], [1, 0, 0]])
    def stream(values):
        return t([[values[0], values[1], dirt], [values[2], dirt, dirt]])
    kw = dict(
        old_logp=stream([-1.1, -0.4, -0.9]), ref_logp=stream([-1.2, -0.6, -1.0]),
        ref_kl_logp=stream([-1.3, -0.5, -1.1]),
        sampler_logp=stream([-1.0, -0.6, -0.8]), entropy=stream([0.5, 0.7, 0.9]),
        ce_weight=mask, ref_kl_weight=mask,
    )
    return stream([-1.0, -0.5, -0.7]), stream([1.0, -1.0, 0.5]), mask, kw


@pytest.mark.parametrize("dirt", [NAN, INF, -INF])
@pytest.mark.parametrize("name", sorted(POLICY_LOSSES))
def test_non_finite_values_outside_mask_do_not_leak(name, dirt):
    # dppo's ratio is against the sampler already: it takes no tis_cap (the sampler stream still flows)
    cfg = LossConfig(policy_loss=name, kl_coef=0.1, entropy_coef=0.01,
                     tis_cap=None if name in SAMPLER_ANCHORED_LOSSES else 2.0)
    results = []
    for value in (dirt, 0.0):
        logp_v, adv, mask, kw = _dirty_and_clean(value)
        logp = logp_v.clone().requires_grad_(True)
        out = compute_loss(inputs(logp, adv, mask, **kw), cfg)
        results.append((out, grad_of(out.loss, logp)))
    (dirty, dirty_grad), (clean, clean_grad) = results
    assert math.isfinite(dirty.loss.item())
    assert dirty.loss.item() == pytest.approx(clean.loss.item())
    torch.testing.assert_close(dirty_grad, clean_grad)
    assert (dirty_grad[t([[0, 0, 1], [0, 1, 1]]).bool()] == 0).all()
    assert all(math.isfinite(v) for v in dirty.metrics.values())


NAN_CASES = [
    (name, field)
    for name in sorted(POLICY_LOSSES)
    for field in ("logp", "advantages", "old_logp", "ref_logp")
    if not (name == "reinforce" and field == "old_logp")  # reinforce does not read old_logp
]


@pytest.mark.parametrize(("name", "field"), NAN_CASES)
def test_nan_at_a_trained_position_gives_non_finite_loss(name, field):
    logp, adv, mask, kw = _dirty_and_clean(0.0)
    streams = {"logp": logp, "advantages": adv, **kw}
    streams[field] = streams[field].clone()
    streams[field][0, 0] = NAN
    x = LossInputs(rl_weight=mask, **streams)
    out = compute_loss(x, LossConfig(policy_loss=name, kl_coef=0.1))
    assert not math.isfinite(out.loss.item())


# ---- validation ---------------------------------------------------------------------------------


def test_config_defaults():
    cfg = LossConfig()
    assert (cfg.policy_loss, cfg.aggregation, cfg.kl_estimator) == ("grpo", "token-mean", "k3")
    assert (cfg.kl_coef, cfg.entropy_coef, cfg.tis_cap) == (0.0, 0.0, None)


def test_gspo_defaults_to_seq_mean_token_mean_aggregation():
    assert LossConfig(policy_loss="gspo").aggregation == "seq-mean-token-mean"
    assert LossConfig(policy_loss="gspo", aggregation="token-mean").aggregation == "token-mean"  # explicit wins
    for name in set(POLICY_LOSSES) - {"gspo"}:
        assert LossConfig(policy_loss=name).aggregation == "token-mean"


def test_gspo_default_aggregation_reaches_compute_loss():
    # Ragged rows (3 and 1 tokens), on-policy: L = −A per token. Sequence means: −1 and 3 → 1;
    # the token mean would be (−3 + 3) / 4 = 0.
    logp = t([[-1.0, -0.5, -2.0], [-0.3, 0.0, 0.0]], grad=True)
    adv, mask = t([[1.0, 1.0, 1.0], [-3.0, -3.0, -3.0]]), t([[1, 1, 1], [1, 0, 0]])
    run = lambda cfg: compute_loss(inputs(logp, adv, rl_weight=mask), cfg).loss.item()  # noqa: E731
    assert run(LossConfig(policy_loss="gspo")) == pytest.approx(1.0)
    assert run(LossConfig(policy_loss="gspo", aggregation="token-mean")) == pytest.approx(0.0)
    assert run(LossConfig(policy_loss="grpo")) == pytest.approx(0.0)


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"policy_loss": "trpo"}, "policy_loss"),
        ({"aggregation": "token-sum"}, "aggregation"),
        ({"aggregation": "constant"}, "constant_normaliser"),
        ({"constant_normaliser": 512.0}, "constant_normaliser"),
        ({"clip_eps_low": 0.2}, "clip_eps_low"),  # grpo does not clip
        ({"policy_loss": "ppo", "clip_eps_low": 1.5}, "clip_eps_low"),
        ({"policy_loss": "ppo", "clip_eps_high": -0.1}, "clip_eps_high"),
        ({"policy_loss": "ppo", "dual_clip": 0.5}, "dual_clip"),
        ({"policy_loss": "gspo", "dual_clip": 3.0}, "dual_clip"),
        ({"kl_coef": -0.1}, "kl_coef"),
        ({"kl_coef": float("nan")}, "kl_coef"),
        ({"kl_estimator": "k4"}, "kl_estimator"),
        ({"entropy_coef": -1.0}, "entropy_coef"),
        ({"tis_cap": 0.0}, "tis_cap"),
        ({"policy_loss": "dro", "dro_beta": 0.0}, "dro_beta"),
        ({"dro_beta": 0.05}, "dro_beta"),
        ({"policy_loss": "cispo", "cispo_cap": 0.2}, "cispo_cap"),
    ],
)
def test_config_rejects_bad_values_naming_the_field(kwargs, field):
    with pytest.raises(ValueError, match=f"LossConfig.{field}"):
        LossConfig(**kwargs)


@pytest.mark.parametrize(
    ("cfg", "extra", "field"),
    [
        (LossConfig(kl_coef=0.1), {}, "ref_logp"),
        (LossConfig(), {"ref_kl_weight": t([[1, 1]])}, "ref_kl_logp"),
        (LossConfig(tis_cap=2.0), {}, "sampler_logp"),
        (LossConfig(entropy_coef=0.1), {}, "entropy"),
        (LossConfig(), {"ce_weight": t([[1, 1, 1]])}, "ce_weight"),
    ],
)
def test_compute_loss_rejects_missing_or_misshaped_streams(cfg, extra, field):
    logp = t([[-1.0, -2.0]])
    with pytest.raises(ValueError, match=f"LossInputs.{field}"):
        compute_loss(inputs(logp, t([[1.0, 1.0]]), **extra), cfg)
