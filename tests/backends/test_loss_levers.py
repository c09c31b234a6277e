"""The loss levers of ``[train]``, from the config to the loss: each knob changes the loss as its
formula says (hand-computed), and the IS correction against the sampler at the token, sequence
(geometric mean) and sequence-product level, truncated or masked.

Values marked "reference" are the worked vectors of the algorithm reference (§11) or other
projects' unit tests, named; the rest are computed by hand from the formula in the comment.
"""

from __future__ import annotations

import math

import pytest

pytestmark = pytest.mark.train
torch = pytest.importorskip("torch")

from rlvr.backends.train.losses import LossInputs, compute_loss  # noqa: E402
from rlvr.backends.train.losses.divergence import sampler_is_weight, sampler_log_ratio  # noqa: E402
from rlvr.backends.train.losses.policy import CLIPPED_LOSSES, DUAL_CLIP_LOSSES, POLICY_LOSSES  # noqa: E402
from rlvr.config.run import run_config_from_dict  # noqa: E402
from rlvr.config.train_section import BUILT_IN_LOSSES, LOSS_KNOBS  # noqa: E402
from rlvr.wiring.levers import loss_config  # noqa: E402


def t(rows):
    rows = rows if rows and isinstance(rows[0], list) else [rows]
    return torch.tensor(rows, dtype=torch.float64)


def train_loss(train: dict, logp, old, adv, **extra) -> float:
    """The rl loss of one config's ``[train]`` section on the given streams (token-mean)."""
    cfg = loss_config(run_config_from_dict({"train": train}))
    logp = t(logp)
    out = compute_loss(LossInputs(logp=logp, old_logp=t(old), advantages=t(adv), rl_weight=torch.ones_like(logp),
                                  **{k: t(v) for k, v in extra.items()}), cfg)
    return out.loss.item(), out.metrics


def test_the_knob_table_of_the_config_is_the_loss_library_s():
    assert set(BUILT_IN_LOSSES) == set(POLICY_LOSSES)
    assert set(LOSS_KNOBS["clip_eps_low"]) == set(LOSS_KNOBS["clip_eps_high"]) == CLIPPED_LOSSES
    assert set(LOSS_KNOBS["dual_clip"]) == DUAL_CLIP_LOSSES
    assert LOSS_KNOBS["cispo_cap"] == ("cispo",) and LOSS_KNOBS["dro_beta"] == ("dro",)
    assert all(LOSS_KNOBS[k] == ("dppo",) for k in ("dppo_mask_low", "dppo_mask_high", "dppo_adv_tau", "dppo_kl_tau"))


def test_clip_eps_high_raises_the_ceiling_of_a_positive_advantage():
    # ρ = 1.25, A = +1: L = −min(ρ, 1 + ε_high)·A → −1.2 at ε_high 0.2, −1.25 (unclipped) at 0.28.
    args = ([math.log(1.25)], [0.0], [1.0])
    assert train_loss({"policy_loss": "ppo"}, *args)[0] == pytest.approx(-1.2)
    loss, metrics = train_loss({"policy_loss": "ppo", "clip_eps_high": 0.28}, *args)
    assert loss == pytest.approx(-1.25) and metrics["train/clip_frac"] == 0.0
    assert train_loss({"policy_loss": "dapo"}, *args)[0] == pytest.approx(-1.25)  # dapo's own 0.28
    assert train_loss({"policy_loss": "dapo", "clip_eps_high": 0.22}, *args)[0] == pytest.approx(-1.22)


def test_clip_eps_low_sets_the_floor_of_a_negative_advantage():
    # ρ = 0.7, A = −1: L = max(−A·ρ, −A·clip(ρ)) = max(0.7, 1 − ε_low) → 0.8 at 0.2, 0.7 at 0.4.
    args = ([math.log(0.7)], [0.0], [-1.0])
    assert train_loss({"policy_loss": "ppo"}, *args)[0] == pytest.approx(0.8)
    assert train_loss({"policy_loss": "ppo", "clip_eps_low": 0.4}, *args)[0] == pytest.approx(0.7)


def test_dual_clip_bounds_a_large_ratio_on_a_negative_advantage():
    # reference §11: PPO ε 0.2, A = −1, ℓ = 1.5 ⇒ 4.481689 without dual clip, 3.0 with c = 3.
    args = ([1.5], [0.0], [-1.0])
    assert train_loss({"policy_loss": "ppo"}, *args)[0] == pytest.approx(4.481689, abs=1e-6)
    loss, metrics = train_loss({"policy_loss": "ppo", "dual_clip": 3.0}, *args)
    assert loss == pytest.approx(3.0) and metrics["train/dual_clip_frac"] == 1.0


def test_cispo_cap_caps_the_detached_weight():
    # L = −sg(min(ρ, cap))·A·logπ with ρ = e^0.5 = 1.6487, A = 1, logπ = −1: 1.6487 at cap 5, 1.5 at cap 1.5.
    args = ([-1.0], [-1.5], [1.0])
    assert train_loss({"policy_loss": "cispo"}, *args)[0] == pytest.approx(math.exp(0.5))
    loss, metrics = train_loss({"policy_loss": "cispo", "cispo_cap": 1.5}, *args)
    assert loss == pytest.approx(1.5) and metrics["train/clip_frac"] == 1.0


def test_dro_beta_scales_the_quadratic_penalty():
    # reference §11 / verl's DRO test: logπ = −0.8, old = −1.0, A = 2, β = 0.05 ⇒ L = 1.601;
    # L = −(logπ·A − ½β(logπ − old)²): β = 0.5 ⇒ 1.6 + 0.25·0.04 = 1.61.
    args = ([-0.8], [-1.0], [2.0])
    assert train_loss({"policy_loss": "dro"}, *args)[0] == pytest.approx(1.601)
    assert train_loss({"policy_loss": "dro", "dro_beta": 0.5}, *args)[0] == pytest.approx(1.61)


# ---- IS against the sampler ------------------------------------------------------------------------


def test_icepop_masks_token_weights_outside_its_bounds():
    # fw cookbook test: IcePop t = 2 on old = [−2, −0.5, 2], sampler 0 ⇒ weights [0, e^−0.5, 0], 2/3 masked.
    mask = t([1.0, 1.0, 1.0])
    weight, masked = sampler_is_weight(t([-2.0, -0.5, 2.0]), t([0.0, 0.0, 0.0]), mask, low=0.5, high=2.0)
    torch.testing.assert_close(weight, t([0.0, math.exp(-0.5), 0.0]))
    torch.testing.assert_close(masked.double(), t([1.0, 0.0, 1.0]))


def test_the_sequence_ratio_is_the_geometric_mean_of_the_row_s_token_ratios():
    # Row ℓ = old − sampler = [0.2, 0.4, 0.9]: geometric mean e^0.5 = 1.6487 on every token; with the last
    # token outside the mask, e^0.3 = 1.3499 on the two left (the masked position carries 0).
    old, sampler = t([0.2, 0.4, 0.9]), t([0.0, 0.0, 0.0])
    torch.testing.assert_close(sampler_log_ratio(old, sampler, t([1.0, 1.0, 1.0]), "sequence"), t([0.5, 0.5, 0.5]))
    torch.testing.assert_close(sampler_log_ratio(old, sampler, t([1.0, 1.0, 0.0]), "sequence"), t([0.3, 0.3, 0.0]))
    weight, truncated = sampler_is_weight(old, sampler, t([1.0, 1.0, 1.0]), level="sequence", cap=1.5)
    torch.testing.assert_close(weight, t([1.5, 1.5, 1.5]))
    assert truncated.tolist() == [[1.0, 1.0, 1.0]]
    weight, _ = sampler_is_weight(old, sampler, t([1.0, 1.0, 0.0]), level="sequence", cap=1.5)
    torch.testing.assert_close(weight[0, :2], torch.tensor([math.exp(0.3)] * 2, dtype=torch.float64))


def test_the_sequence_product_is_trl_s_sequence_mask():
    # TRL's sequence_mask: w = exp(Σ_t m·(old − sampling)), 0 outside [clip_min, clip_max] (cap 3).
    # Row 1 Σ = 1.5 ⇒ e^1.5 = 4.48 > 3: masked whole; row 2 Σ = 0.6 ⇒ e^0.6 = 1.822 kept on each token.
    old, sampler, mask = t([[0.2, 0.4, 0.9], [0.2, 0.4, 0.0]]), t([[0.0] * 3, [0.0] * 3]), t([[1.0] * 3, [1.0] * 3])
    weight, masked = sampler_is_weight(old, sampler, mask, level="sequence_product", high=3.0)
    torch.testing.assert_close(weight, t([[0.0] * 3, [math.exp(0.6)] * 3]))
    assert masked.tolist() == [[1.0] * 3, [0.0] * 3]
    # The geometric mean of the same rows (e^0.5, e^0.2) is inside the bound: neither is masked.
    assert sampler_is_weight(old, sampler, mask, level="sequence", high=3.0)[1].sum() == 0


def test_masked_sequence_is_drops_a_row_from_the_loss_but_not_from_the_token_count():
    # grpo on-policy (ratio 1): per-token L = −A·w; rows of 2 tokens with A = 1 and 2; ℓ rows: Σ = 2.0 and 0.2.
    # sequence_product, mis_high 2: row 1 e^2 = 7.39 masked (w 0), row 2 w = e^0.2 on both tokens.
    # token-mean over the 4 rl tokens: (0 + 0 − 2e^0.2 − 2e^0.2)/4 = −e^0.2.
    train = {"mis_high": 2.0, "is_level": "sequence_product"}
    loss, metrics = train_loss(train, [[0.0, 0.0], [0.0, 0.0]], [[0.0, 0.0], [0.0, 0.0]], [[1.0, 1.0], [2.0, 2.0]],
                               sampler_logp=[[-1.0, -1.0], [-0.1, -0.1]])
    assert loss == pytest.approx(-math.exp(0.2))
    assert metrics["train/mis_masked_frac"] == pytest.approx(0.5)
    assert metrics["train/mis_weight"] == pytest.approx(math.exp(0.2) / 2)
    # Per token with the same cap, only the row-1 tokens (ℓ = 1 each, e^1 = 2.72) are masked too.
    loss, metrics = train_loss({"mis_high": 2.0}, [[0.0, 0.0], [0.0, 0.0]], [[0.0, 0.0], [0.0, 0.0]],
                               [[1.0, 1.0], [2.0, 2.0]], sampler_logp=[[-1.0, -1.0], [-0.1, -0.1]])
    assert loss == pytest.approx(-math.exp(0.1)) and metrics["train/mis_masked_frac"] == pytest.approx(0.5)


def test_truncated_sequence_is_caps_the_shared_row_weight():
    # grpo, one row ℓ = [0.5, 0.1] ⇒ geometric mean e^0.3 = 1.35 > cap 1.2: w = 1.2 on both; L = −A·w = −1.2.
    loss, metrics = train_loss({"tis_cap": 1.2, "is_level": "sequence"}, [0.0, 0.0], [0.0, 0.0], [1.0, 1.0],
                               sampler_logp=[-0.5, -0.1])
    assert loss == pytest.approx(-1.2)
    assert metrics["train/tis_clip_frac"] == 1.0 and metrics["train/tis_weight"] == pytest.approx(1.2)
