"""The learning-rate schedule: hand-computed factors for each kind, warmup and the run's horizon."""

from __future__ import annotations

import math

import pytest

from rlvr.lr_schedule import LRSchedule, plan_schedule, schedule_horizon


def factors(schedule: LRSchedule, steps: range) -> list[float]:
    return [schedule.factor(t) for t in steps]


def test_cosine_warms_up_then_starts_its_decay_at_the_peak():
    s = LRSchedule("cosine", total_steps=10, warmup_steps=2)
    # Warmup t/W; then p = (t - 1 - W)/(T - W): step 3 at p = 0, step 7 at p = 1/2, step 10 at 7/8.
    assert factors(s, range(1, 4)) == [0.5, 1.0, 1.0]
    assert s.factor(7) == pytest.approx(0.5)
    assert s.factor(10) == pytest.approx(0.5 * (1 + math.cos(7 * math.pi / 8)))  # 0.0380602
    assert s.factor(10) == pytest.approx(0.0380602, abs=1e-7)
    assert s.factor(11) == s.factor(500) == 0.0  # past the horizon: where the curve ends


def test_linear_decays_to_its_floor():
    s = LRSchedule("linear", total_steps=10, min_lr_ratio=0.1)
    assert s.factor(1) == 1.0  # no warmup: the first step at the peak
    assert s.factor(6) == pytest.approx(0.1 + 0.9 * 0.5)  # p = 5/10
    assert s.factor(10) == pytest.approx(0.1 + 0.9 * 0.1)  # p = 9/10: the last step is not spent at the floor
    assert s.factor(11) == pytest.approx(0.1)


def test_wsd_is_flat_until_its_decay_phase():
    s = plan_schedule("wsd", 10, warmup_steps=2, decay_ratio=0.3)
    assert (s.warmup_steps, s.decay_steps) == (2, 3)
    assert factors(s, range(1, 9)) == [0.5, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0]
    assert s.factor(9) == pytest.approx(2 / 3) and s.factor(10) == pytest.approx(1 / 3)
    assert plan_schedule("wsd", 34).decay_steps == 4  # default: 10% of the run, rounded up


def test_constant_with_a_warmup_ratio_rounds_the_warmup_up():
    s = plan_schedule("constant", 34, warmup_ratio=0.1)
    assert s.warmup_steps == 4  # ceil(3.4), as Hugging Face rounds it
    assert factors(s, range(1, 7)) == [0.25, 0.5, 0.75, 1.0, 1.0, 1.0]
    assert factors(plan_schedule("constant", 5), range(1, 4)) == [1.0, 1.0, 1.0]


def test_combinations_that_cannot_be_honoured_are_refused():
    with pytest.raises(ValueError, match="warmup_steps or warmup_ratio, not both"):
        plan_schedule("cosine", 10, warmup_steps=2, warmup_ratio=0.1)
    with pytest.raises(ValueError, match="decay_ratio is for lr_schedule = 'wsd', not 'cosine'"):
        plan_schedule("cosine", 10, decay_ratio=0.2)
    with pytest.raises(ValueError, match="10 warmup steps leave no room to decay in 10 steps"):
        plan_schedule("linear", 10, warmup_steps=10)
    with pytest.raises(ValueError, match="not one of"):
        LRSchedule("step", 10)
    assert plan_schedule("constant", 3, warmup_steps=5).factor(3) == pytest.approx(0.6)  # no decay to make room for


def test_the_horizon_is_max_steps_or_the_epochs_whichever_ends_first():
    assert schedule_horizon(100, None, 1000, 32) == 100
    assert schedule_horizon(100, 2, 250, 32) == 16  # ceil(2 * 250 / 32)
    assert schedule_horizon(10, 2, 250, 32) == 10


def test_a_schedule_round_trips_through_its_dict():
    s = plan_schedule("cosine", 40, warmup_ratio=0.1, min_lr_ratio=0.05)
    assert LRSchedule(**s.as_dict()) == s
