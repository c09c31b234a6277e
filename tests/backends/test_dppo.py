"""DPPO+KL (prime-rl's default rl loss): the probability-difference trust region and the squared
log-ratio penalty, on hand-computed tokens, through the loss library and through ``[train]``.

Every expected value below is computed by hand from
L = −keep · τ_adv · A · ρ + τ_KL · (logπ − logμ)², ρ = π/μ, masked where Δp = π − μ leaves the region
on the side the advantage pushes (defaults: masks 0.2/0.2, τ_adv 1, τ_KL 1e-3).
"""

from __future__ import annotations

import math

import pytest

pytestmark = pytest.mark.train
torch = pytest.importorskip("torch")

from rlvr.backends.train.losses import LossConfig, LossInputs, compute_loss  # noqa: E402
from rlvr.backends.train.losses.policy import dppo  # noqa: E402
from rlvr.config.run import run_config_from_dict  # noqa: E402
from rlvr.errors import ConfigError  # noqa: E402
from rlvr.wiring.levers import loss_config  # noqa: E402

# (π, μ, A) per token, and L by hand:
TOKENS = [
    (0.6, 0.3, 1.0),   # Δp = +0.3 > 0.2, A > 0: masked; L = 1e-3·ln(2)² = 4.80453e-4
    (0.4, 0.3, 1.0),   # Δp = +0.1: kept; ρ = 4/3; L = −4/3 + 1e-3·ln(4/3)² = −1.3332506
    (0.1, 0.4, -1.0),  # Δp = −0.3 < −0.2, A < 0: masked; L = 1e-3·ln(1/4)² = 1.921812e-3
    (0.3, 0.4, -2.0),  # Δp = −0.1: kept; ρ = 3/4; L = 2·0.75 + 1e-3·ln(3/4)² = 1.5000828
    (0.9, 0.5, -1.0),  # Δp = +0.4 but A < 0 looks at the low side only: kept; L = 1.8 + 1e-3·ln(1.8)² = 1.8003455
]
BY_HAND = [4.80453e-4, -1.3332506, 1.921812e-3, 1.5000828, 1.8003455]


def streams(tokens=TOKENS):
    p, mu, adv = zip(*tokens, strict=True)
    logp = torch.tensor([[math.log(x) for x in p]], dtype=torch.float64, requires_grad=True)
    anchor = torch.tensor([[math.log(x) for x in mu]], dtype=torch.float64)
    return logp, anchor, torch.tensor([adv], dtype=torch.float64)


def test_each_token_s_loss_and_mask_equal_the_hand_computed_ones():
    logp, anchor, adv = streams()
    loss, diag = dppo(logp, anchor, adv, torch.ones_like(adv, dtype=torch.bool))
    assert loss[0].tolist() == pytest.approx(BY_HAND, abs=1e-7)
    assert diag["clip_frac"][0].tolist() == [1, 0, 1, 0, 0]
    assert diag["dppo_masked_high"][0].tolist() == [1, 0, 0, 0, 0]
    assert diag["dppo_masked_low"][0].tolist() == [0, 0, 1, 0, 0]


def test_a_masked_token_gets_only_the_kl_gradient_and_a_kept_one_the_unclipped_ratio_s():
    logp, anchor, adv = streams(TOKENS[:2])
    loss, _ = dppo(logp, anchor, adv, torch.ones_like(adv, dtype=torch.bool))
    loss.sum().backward()
    # masked: ∂L/∂logπ = 2·τ_KL·ln 2 = 1.3862944e-3; kept: −A·ρ + 2·τ_KL·ln(4/3) = −1.3327580
    assert logp.grad[0].tolist() == pytest.approx([1.3862944e-3, -1.3327580], abs=1e-7)


def test_the_masks_the_taus_and_the_loss_mask_are_the_knobs_they_say():
    logp, anchor, adv = streams(TOKENS[:2])
    # mask_high 0.35: the first token is back in the region, −2 + 1e-3·ln(2)² = −1.9995195
    loss, diag = dppo(logp, anchor, adv, torch.ones_like(adv, dtype=torch.bool), mask_high=0.35)
    assert loss[0, 0].item() == pytest.approx(-1.9995195, abs=1e-7) and diag["clip_frac"][0, 0] == 0
    # τ_adv 0.5, τ_KL 0: the kept token is −0.5·4/3 = −0.6666667, the masked one exactly 0
    loss, _ = dppo(logp, anchor, adv, torch.ones_like(adv, dtype=torch.bool), adv_tau=0.5, kl_tau=0.0)
    assert loss[0].tolist() == pytest.approx([0.0, -2 / 3], abs=1e-7)
    # outside the loss mask the penalty is not charged (the aggregator drops the token anyway)
    loss, _ = dppo(logp, anchor, adv, torch.tensor([[False, True]]))
    assert loss[0, 0].item() == 0.0


def test_compute_loss_anchors_dppo_on_the_sampler_and_masked_tokens_count_in_the_mean():
    logp, anchor, adv = streams(TOKENS[:2])
    cfg = LossConfig(policy_loss="dppo")
    inputs = LossInputs(logp=logp, old_logp=logp.detach(), advantages=adv, rl_weight=torch.ones_like(adv),
                        sampler_logp=anchor)
    out = compute_loss(inputs, cfg)
    # token-mean over both tokens, the masked one included: (4.80453e-4 − 1.3332506) / 2 = −0.6663851
    assert out.loss.item() == pytest.approx(-0.6663851, abs=1e-7)
    assert out.metrics["train/clip_frac"] == 0.5 and out.metrics["train/dppo_masked_high"] == 0.5
    # without the sampler's log-probs the anchor is the old policy: ρ = 1, Δp = 0, L = −A = −1 per token
    no_sampler = LossInputs(logp=logp, old_logp=logp.detach(), advantages=adv, rl_weight=torch.ones_like(adv))
    assert compute_loss(no_sampler, cfg).loss.item() == pytest.approx(-1.0)


def test_train_section_sets_the_knobs_and_refuses_what_dppo_does_not_read():
    cfg = loss_config(run_config_from_dict({"train": {"policy_loss": "dppo", "dppo_mask_high": 0.35,
                                                      "dppo_kl_tau": 0.0}}))
    assert cfg.policy_loss_params()["dppo_mask_high"] == 0.35 and cfg.policy_loss_params()["dppo_kl_tau"] == 0.0
    with pytest.raises(Exception, match=r"train.dppo_mask_low is not used by policy_loss = 'ppo'"):
        run_config_from_dict({"train": {"policy_loss": "ppo", "dppo_mask_low": 0.1}})
    with pytest.raises(ConfigError, match=r"train.tis_cap: policy_loss='dppo' takes its ratio against the sampler"):
        loss_config(run_config_from_dict({"train": {"policy_loss": "dppo", "tis_cap": 2.0}}))
    with pytest.raises(ValueError, match=r"LossConfig.dppo_mask_low: must be finite and > 0"):
        LossConfig(policy_loss="dppo", dppo_mask_low=-0.1)
