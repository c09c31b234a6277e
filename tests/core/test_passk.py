"""pass@k (Chen et al. 2021) against hand-computed values, and the summary of sampled episodes."""

from __future__ import annotations

import pytest

from rlvr.data.tasks import load_tasks
from rlvr.errors import RLLoopError
from rlvr.run.passk import ks_for, pass_at_k, sample_rewards, summarise
from rlvr.types import EvalReport


@pytest.mark.parametrize(("n", "c", "k", "expected"), [
    (5, 2, 1, 0.4),              # c / n
    (5, 2, 2, 1 - 3 / 10),       # 1 - C(3,2)/C(5,2)
    (10, 3, 4, 1 - 35 / 210),    # 1 - C(7,4)/C(10,4)
    (4, 0, 4, 0.0),
    (4, 4, 1, 1.0),
    (3, 1, 3, 1.0),              # n - c < k: every draw of 3 holds the correct one
    (1, 1, 1, 1.0),
])
def test_pass_at_k_matches_hand_computed_values(n, c, k, expected):
    assert pass_at_k(n, c, k) == pytest.approx(expected)


@pytest.mark.parametrize(("n", "c", "k"), [(4, 5, 1), (4, 2, 5), (4, 2, 0), (4, -1, 1)])
def test_pass_at_k_refuses_impossible_counts(n, c, k):
    with pytest.raises(ValueError, match="pass@k needs"):
        pass_at_k(n, c, k)


def test_ks_are_powers_of_two_up_to_n_and_n():
    assert ks_for(1) == [1]
    assert ks_for(4) == [1, 2, 4]
    assert ks_for(6) == [1, 2, 4, 6]


def test_summary_averages_over_tasks_and_counts_what_it_covers():
    rewards = {"a": [1.0, 0.0, 0.0, 1.0], "b": [0.0, 0.0, 0.0, 0.0], "c": [0.5, 1.0]}
    out = summarise(rewards, 4)
    # pass@1: a 2/4, b 0, c 1/2 -> mean 1/3; pass@2 covers a, b, c; pass@4 covers a and b only.
    assert out["pass@1"] == pytest.approx((0.5 + 0 + 0.5) / 3)
    assert out["pass@2"] == pytest.approx((1 - 1 / 6 + 0 + 1.0) / 3)
    assert out["pass@4"] == pytest.approx(0.5) and out["pass@4_tasks"] == 2
    assert out["mean@4"] == pytest.approx(3.5 / 10)
    assert out["per_task"]["a"] == {"rewards": [1.0, 0.0, 0.0, 1.0], "passed": 2}


def test_summary_refuses_when_no_reward_applied():
    with pytest.raises(RLLoopError, match="none of the tasks"):
        summarise({"a": []}, 2)


def test_sample_rewards_calls_one_evaluator_per_sample():
    seen = []

    def make(j):
        def evaluate(step, tasks):
            seen.append(j)
            return EvalReport(step, 0.0, len(tasks), {t.id: float(j % 2) for t in tasks})
        return evaluate

    tasks = load_tasks([{"id": "x", "prompt": "1+1=", "answer": "2"}, {"id": "y", "prompt": "1+2=", "answer": "3"}])
    assert sample_rewards(make, 3, tasks, 3) == {"x": [0.0, 1.0, 0.0], "y": [0.0, 1.0, 0.0]}
    assert seen == [0, 1, 2]
