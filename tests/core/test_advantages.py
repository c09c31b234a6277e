"""Group-relative advantages on hand-computed values, plus their shared conventions."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rlvr import ADVANTAGES, dr_grpo, grpo, rloo
from rlvr.algos.advantages import GRPO_EPS

ESTIMATORS = [grpo, dr_grpo, rloo]


def test_registry_maps_each_config_name_to_its_function():
    assert ADVANTAGES == {"grpo": grpo, "dr_grpo": dr_grpo, "rloo": rloo}


def test_grpo_uses_unbiased_std_plus_eps():
    # rewards 1,0,0,0: mean 0.25; unbiased var = (0.75² + 3·0.25²) / 3 = 0.25, so σ = 0.5.
    assert GRPO_EPS == 1e-6
    assert grpo([1.0, 0.0, 0.0, 0.0]) == pytest.approx(
        [0.75 / (0.5 + 1e-6), -0.25 / (0.5 + 1e-6), -0.25 / (0.5 + 1e-6), -0.25 / (0.5 + 1e-6)], rel=1e-12)
    # rewards 0,1: mean 0.5; unbiased σ = sqrt(0.5) (population would be 0.5).
    assert grpo([0.0, 1.0]) == pytest.approx([-0.5 / (math.sqrt(0.5) + 1e-6), 0.5 / (math.sqrt(0.5) + 1e-6)],
                                             rel=1e-12)


def test_dr_grpo_only_centres():
    assert dr_grpo([1.0, 0.0, 0.0, 0.0]) == pytest.approx([0.75, -0.25, -0.25, -0.25])
    assert dr_grpo([2.0, 4.0]) == pytest.approx([-1.0, 1.0])


def test_rloo_subtracts_the_leave_one_out_mean():
    # A_i = r_i - mean of the others: 1 - 0 = 1; 0 - 1/3.
    assert rloo([1.0, 0.0, 0.0, 0.0]) == pytest.approx([1.0, -1 / 3, -1 / 3, -1 / 3])
    assert rloo([3.0, 1.0, 2.0]) == pytest.approx([3 - 1.5, 1 - 2.5, 2 - 2.0])


@pytest.mark.parametrize("fn", ESTIMATORS)
def test_singleton_group_carries_no_signal(fn):
    assert fn([1.0]) == [0.0]


@pytest.mark.parametrize("fn", ESTIMATORS)
def test_zero_variance_group_is_exactly_zero(fn):
    result = fn([0.7, 0.7, 0.7])
    assert result == [0.0, 0.0, 0.0]
    assert all(a == 0.0 and math.copysign(1, a) == 1 for a in result)


@pytest.mark.parametrize("fn", ESTIMATORS)
@given(rewards=st.lists(st.floats(-10, 10, allow_nan=False, allow_infinity=False), min_size=2, max_size=16)
       .filter(lambda rs: len(set(rs)) > 1))
def test_advantages_sum_to_zero_for_non_constant_groups(fn, rewards):
    advantages = fn(rewards)
    assert len(advantages) == len(rewards)
    scale = max(1.0, max(abs(a) for a in advantages))
    assert math.fsum(advantages) == pytest.approx(0.0, abs=1e-9 * len(rewards) * scale)


@pytest.mark.parametrize("fn", ESTIMATORS)
@given(rewards=st.lists(st.sampled_from([0.0, 0.5, 1.0]), min_size=2, max_size=8).filter(lambda rs: len(set(rs)) > 1))
def test_better_completions_get_larger_advantages(fn, rewards):
    advantages = fn(rewards)
    ranked = sorted(zip(rewards, advantages, strict=True))
    assert all(a1 <= a2 for (_, a1), (_, a2) in zip(ranked, ranked[1:], strict=False))
    assert advantages[rewards.index(max(rewards))] > 0 > advantages[rewards.index(min(rewards))]
