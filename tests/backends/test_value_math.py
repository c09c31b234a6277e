"""The critic's math against verl's published formulas (reference/algorithms.md §2.13, verl's
``compute_gae_advantage_return``, ``compute_value_loss``, ``masked_whiten``), on hand-computed cases.

GAE: δ_t = r_t + γ·V_{t+1} − V_t, A_t = δ_t + γλ·A_{t+1}, masked positions carried through;
returns = A + V. Value loss: ½·token-mean(max((V − R)², (clip(V, V_old ± c) − R)²)). Every expected
number below is worked out in the comment beside it.
"""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from rlvr.backends.train.losses.value import explained_variance, gae, masked_whiten, value_loss  # noqa: E402


def t(*values):
    """A float tensor of one nested list, or of the numbers given."""
    return torch.tensor(values[0] if len(values) == 1 else values, dtype=torch.float32)


def flat(rows):
    return [float(x) for row in rows for x in row]


def check_gae(rewards, values, mask, gamma, lam, advantages, returns):
    a, r = gae(t(rewards), t(values), t(mask), gamma, lam)
    assert a.shape == t(mask).shape
    assert flat(a.tolist()) == pytest.approx(flat(advantages), abs=1e-6)
    assert flat(r.tolist()) == pytest.approx(flat(returns), abs=1e-6)


def test_gae_gamma_1_lam_1_is_the_return_minus_the_value():
    # δ2 = 1 − .5 = .5; δ1 = 0 + .5 − .5 = 0, A1 = .5; δ0 = 0, A0 = .5; R = A + V = 1.
    check_gae([[0, 0, 1]], [[.5, .5, .5]], [[1, 1, 1]], 1.0, 1.0, [[.5, .5, .5]], [[1, 1, 1]])


def test_gae_lam_0_is_the_one_step_td_error():
    # δ2 = 1 − .6 = .4; δ1 = .6 − .4 = .2; δ0 = .4 − .2 = .2 (λ = 0: A = δ); R = [.4, .6, 1].
    check_gae([[0, 0, 1]], [[.2, .4, .6]], [[1, 1, 1]], 1.0, 0.0, [[.2, .2, .4]], [[.4, .6, 1.0]])


def test_gae_gamma_0_sees_only_the_token_own_reward():
    # γ = 0: A_t = r_t − V_t = [−.2, −.4, .4]; R = r = [0, 0, 1].
    check_gae([[0, 0, 1]], [[.2, .4, .6]], [[1, 1, 1]], 0.0, 1.0, [[-.2, -.4, .4]], [[0, 0, 1]])


def test_gae_gamma_and_lam_halves():
    # γ = λ = .5: δ2 = .4, A2 = .4; δ1 = .5·.6 − .4 = −.1, A1 = −.1 + .25·.4 = 0;
    # δ0 = .5·.4 − .2 = 0, A0 = 0 + .25·0 = 0; R = [.2, .4, 1].
    check_gae([[0, 0, 1]], [[.2, .4, .6]], [[1, 1, 1]], 0.5, 0.5, [[0, 0, .4]], [[.2, .4, 1.0]])


def test_gae_zero_values_discount_the_reward_back():
    # V = 0, γ = .9, λ = .95: A1 = 1; A0 = 0 + .855·1 = .855.
    check_gae([[0, 1]], [[0, 0]], [[1, 1]], 0.9, 0.95, [[.855, 1]], [[.855, 1]])


def test_gae_carries_through_an_environment_span():
    # mask [1,0,1,1], γ = .5, λ = 1; V at the masked token (9) never counts.
    # t3: δ = 1 − .5 = .5, A = .5. t2: δ = 0 + .5·.5 − .3 = −.05, A = −.05 + .5·.5 = .2.
    # t1: masked, next value .3 and A .2 carried. t0: δ = 0 + .5·.3 − .1 = .05, A = .05 + .5·.2 = .15.
    # R = A + V = [.25, 0, .5, 1]; the masked position is 0 in both.
    check_gae([[0, 0, 0, 1]], [[.1, 9.0, .3, .5]], [[1, 0, 1, 1]], 0.5, 1.0,
              [[.15, 0, .2, .5]], [[.25, 0, .5, 1.0]])


def test_gae_padding_rows_are_independent_and_padding_is_zero():
    # Row 0 has two tokens then padding (values 7 there never count): A1 = 1 − .5 = .5, A0 = 0 + .5 − .5 + .5.
    # Row 1, V = 0, γ = λ = 1: every A = 1.
    check_gae([[0, 1, 0, 0], [0, 0, 0, 1]], [[.5, .5, 7, 7], [0, 0, 0, 0]], [[1, 1, 0, 0], [1, 1, 1, 1]], 1.0, 1.0,
              [[.5, .5, 0, 0], [1, 1, 1, 1]], [[1, 1, 0, 0], [1, 1, 1, 1]])


def test_gae_ignores_nan_outside_the_mask_and_a_fully_masked_row():
    # Row 0: the NaN reward and value sit on a masked token: A0 = 1 + 0 − .5 = .5. Row 1: no token at all.
    check_gae([[1, math.nan], [1, 1]], [[.5, math.nan], [3, 3]], [[1, 0], [0, 0]], 1.0, 1.0,
              [[.5, 0], [0, 0]], [[1, 0], [0, 0]])


def test_masked_whiten_uses_the_bessel_corrected_variance_over_the_mask():
    # [1, 2, 3] over the mask: mean 2, var (1 + 0 + 1)/(3 − 1) = 1 → [−1, 0, 1]; the masked 100 is 0.
    out = masked_whiten(t([1, 2, 3, 100]), t([1, 1, 1, 0]))
    assert out.tolist() == pytest.approx([-1, 0, 1, 0], abs=1e-6)
    # [0, 4]: mean 2, var (4 + 4)/1 = 8 → ±2/√8 = ±0.7071.
    assert masked_whiten(t([0, 4]), t([1, 1])).tolist() == pytest.approx([-0.70710678, 0.70710678], abs=1e-6)
    assert masked_whiten(t([5, 6]), t([1, 0])).tolist() == [0, 0]  # one token: no spread to scale by


def check_value_loss(v, v_old, r, mask, clip, loss, clip_frac, denominator=None):
    v = t(v).requires_grad_(True)
    out, frac = value_loss(v, t(v_old), t(r), t(mask), clip, denominator=denominator)
    assert float(out.detach()) == pytest.approx(loss, abs=1e-6)
    assert float(frac) == pytest.approx(clip_frac, abs=1e-6)
    out.backward()
    return flat(v.grad.tolist())


def test_value_loss_inside_the_clip_range_is_half_the_squared_error():
    # c = .5: clip(1.0, .3, 1.3) = 1.0, both errors (1 − 1.5)² = .25 → ½·.25 = .125, nothing clipped.
    grad = check_value_loss([[1.0]], [[0.8]], [[1.5]], [[1]], 0.5, 0.125, 0.0)
    assert grad == pytest.approx([-0.5])  # d/dV ½(V − R)² = V − R


def test_value_loss_keeps_the_unclipped_error_when_it_is_larger():
    # V = 2 beyond V_old + c = 1.3: unclipped (2 − 1.5)² = .25, clipped (1.3 − 1.5)² = .04 → max .25 → .125.
    grad = check_value_loss([[2.0]], [[0.8]], [[1.5]], [[1]], 0.5, 0.125, 0.0)
    assert grad == pytest.approx([0.5])


def test_value_loss_takes_the_clipped_error_and_stops_the_gradient():
    # R = 2.5: unclipped (2 − 2.5)² = .25, clipped (1.3 − 2.5)² = 1.44 → ½·1.44 = .72, clipped; the clipped
    # prediction is constant in V, so no gradient.
    grad = check_value_loss([[2.0]], [[0.8]], [[2.5]], [[1]], 0.5, 0.72, 1.0)
    assert grad == [0.0]


def test_value_loss_clips_below_too():
    # V = −1, V_old = 0, c = .5 → clip −.5. R = 0: errors 1 and .25 → ½; R = −2: errors 1 and 2.25 → 1.125, clipped.
    check_value_loss([[-1.0]], [[0.0]], [[0.0]], [[1]], 0.5, 0.5, 0.0)
    check_value_loss([[-1.0]], [[0.0]], [[-2.0]], [[1]], 0.5, 1.125, 1.0)


def test_value_loss_is_a_token_mean_over_the_mask():
    # Tokens .25 and 1.44 (the cases above) and a masked token far off: ½·(.25 + 1.44)/2 = .4225; 1 of 2 clipped.
    check_value_loss([[1.0, 2.0, 100.0]], [[0.8, 0.8, 0.0]], [[1.5, 2.5, -100.0]], [[1, 1, 0]], 0.5, 0.4225, 0.5)
    # The same micro-batch as part of a minibatch of 4 critic tokens: ½·1.69/4 = .21125, clipped 1/4.
    check_value_loss([[1.0, 2.0, 100.0]], [[0.8, 0.8, 0.0]], [[1.5, 2.5, -100.0]], [[1, 1, 0]], 0.5, 0.21125, 0.25,
                     denominator=4.0)


def test_value_loss_ignores_nan_outside_the_mask():
    grad = check_value_loss([[1.0, math.nan]], [[0.8, math.nan]], [[1.5, math.nan]], [[1, 0]], 0.5, 0.125, 0.0)
    assert grad == pytest.approx([-0.5, 0.0])


def test_explained_variance():
    returns, mask = t(1, 2, 3, 4), t(1, 1, 1, 1)
    assert explained_variance(returns, returns, mask) == pytest.approx(1.0)
    # V = R/2: Var(R − V) = Var(R)/4 → 1 − ¼·Var(R)/(Var(R) + 1e-5), Var(R) = 5/3.
    assert explained_variance(returns, returns / 2, mask) == pytest.approx(1 - 0.25 * (5 / 3) / (5 / 3 + 1e-5))
    # A constant value explains nothing: Var(R − c) = Var(R).
    assert explained_variance(returns, t(2, 2, 2, 2), mask) == pytest.approx(0.0, abs=1e-5)
    assert math.isnan(explained_variance(returns, returns, t(1, 0, 0, 0)))
