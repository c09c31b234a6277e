"""Credit shaping around the algorithm's credit: DAPO's overlong penalty and the length penalty on the
rewards (hand-computed, recorded as reward components), truncated completions masked after the
advantages; and through the loop, what the trainer is given and what the record says."""

from __future__ import annotations

import dataclasses

import pytest

from conftest import make_rig, small_config
from rlvr.algos import GRPO, advantages
from rlvr.errors import ConfigError
from rlvr.rollouts.shaping import Shaping, length_penalties
from rlvr.testing import FakeSampler
from rlvr.types import Rollout, StopReason, Task

TASK = Task("t0", ({"role": "user", "content": "q"},), "a", "h0")


def sample(reward: float, length: int, stop: StopReason = StopReason.STOP) -> list[Rollout]:
    return [Rollout("t0", (1,), (7,) * length, (0.0,) * length, "x" * length, (), reward=reward, stop_reason=stop)]


def test_dapo_overlong_penalty_is_linear_over_the_buffer():
    # Budget 16, buffer 4, penalty 1: min(−(L − 12)/4, 0) → 0 up to 12 tokens, −0.5 at 14, −1 at 16.
    shaping = Shaping(overlong_buffer=4, max_tokens=16)
    assert [shaping.overlong(n) for n in (3, 12, 13, 14, 16)] == [0.0, 0.0, -0.25, -0.5, -1.0]
    assert Shaping(overlong_buffer=4, overlong_penalty=0.5, max_tokens=16).overlong(14) == -0.25


def test_length_penalty_is_scaled_by_the_group_s_success_and_its_longest():
    # prime-rl's linear penalty: −w·μ·L/max L with μ = 0.5, w = 0.25, max L = 8.
    assert length_penalties([1, 0, 1, 0], [4, 8, 2, 8], 0.25) == [-0.0625, -0.125, -0.03125, -0.125]
    assert length_penalties([0, 0], [3, 5], 0.25) == [-0.0, -0.0]  # nothing solved: not pushed to be short


def test_shaped_rewards_are_what_the_advantages_see_and_each_term_is_recorded():
    shaping = Shaping(overlong_buffer=4, max_tokens=16)
    samples = [sample(1.0, 10), sample(1.0, 14), sample(0.0, 16, StopReason.LENGTH), sample(0.0, 5)]
    group = shaping.credit(GRPO(), TASK, samples)
    shaped = [1.0, 0.5, -1.0, 0.0]
    assert [r.reward for r in group.rollouts] == shaped
    assert [r.metrics["overlong"] for r in group.rollouts] == [0.0, -0.5, -1.0, 0.0]
    assert [r.metrics["unshaped"] for r in group.rollouts] == [1.0, 1.0, 0.0, 0.0]
    assert [r.advantage for r in group.rollouts] == pytest.approx(advantages.grpo(shaped))


def test_truncated_completions_carry_no_policy_gradient_but_count_in_the_baseline():
    samples = [sample(1.0, 3), sample(0.0, 3), sample(1.0, 8, StopReason.LENGTH), sample(0.0, 8, StopReason.LENGTH)]
    plain = GRPO().credit(TASK, samples)
    group = Shaping(mask_truncated=True).credit(GRPO(), TASK, samples)
    # TRL's mask_truncated_completions: the advantages are the group's (truncated rewards included) ...
    assert [r.advantages for r in group.rollouts] == [r.advantages for r in plain.rollouts]
    # ... and the truncated completions' tokens carry none of it.
    assert [r.rl_mask for r in group.rollouts] == [(1.0,) * 3, (1.0,) * 3, (0.0,) * 8, (0.0,) * 8]
    assert [r.reward for r in group.rollouts] == [1.0, 0.0, 1.0, 0.0]  # not a reward change
    assert Shaping().credit(GRPO(), TASK, samples) == plain  # inactive: the identity


def test_the_algorithm_s_weight_and_masking_combine():
    samples = [sample(1.0, 2), sample(0.0, 2, StopReason.LENGTH)]
    group = Shaping(mask_truncated=True).credit(GRPO().with_weight(0.5), TASK, samples)
    assert [r.rl_mask for r in group.rollouts] == [(0.5, 0.5), (0.0, 0.0)]


def test_shaping_refuses_a_buffer_without_or_beyond_a_budget():
    with pytest.raises(ConfigError, match="give max_tokens too"):
        Shaping(overlong_buffer=4)
    with pytest.raises(ConfigError, match="must be within 1..max_tokens=3"):
        Shaping(overlong_buffer=4, max_tokens=3)
    with pytest.raises(ConfigError, match="length_penalty"):
        Shaping(length_penalty=-1.0)


class CutSampler(FakeSampler):
    """FakeSampler whose completions longer than ``budget`` tokens are cut there (stop reason length)."""

    budget = 6

    def _one(self, task, i, version, p, rng):
        r = super()._one(task, i, version, p, rng)
        if len(r.completion_ids) <= self.budget:
            return r
        n = self.budget
        return dataclasses.replace(r, completion_ids=r.completion_ids[:n], logprobs=r.logprobs[:n],
                                   stop_reason=StopReason.LENGTH)


def test_the_loop_trains_on_shaped_credit_and_records_the_terms():
    # Wrong answers are "not N (k)": longer than 6 tokens, so cut; right ones are the bare number.
    shaping = Shaping(mask_truncated=True, overlong_buffer=2, max_tokens=6)
    rig = make_rig(small_config(max_steps=3, group_k=4), skill=0.5, sampler_cls=CutSampler, shaping=shaping)
    record = rig.loop.run()
    rollouts = [r for call in rig.trainer.calls for r in call.rollouts]
    cut = [r for r in rollouts if r.stop_reason == StopReason.LENGTH]
    assert cut and all(not any(r.rl_mask) for r in cut)
    assert all(r.metrics["overlong"] == -1.0 and r.reward == r.metrics["unshaped"] - 1.0 for r in cut)
    metrics = record.metrics[-1]
    assert metrics["reward/overlong"] < 0 and "reward/unshaped" in metrics
