"""``loop.advantage = 'gae'`` in the core: the reward on each rollout's last trained token for a critic,
episodes of several segments refused, and a trainer without a critic refused before anything runs."""

from __future__ import annotations

import pytest

from rlvr import GRPOConfig, RLLoop
from rlvr.algos import GRPO, Echo
from rlvr.errors import RLLoopError
from rlvr.rollouts.checks import check_credit
from rlvr.testing import FakeTrainer, ScriptedEvaluator, exact_match, make_rows
from rlvr.types import Rollout, Task

TASK = Task("row-1", ({"role": "user", "content": "2+2="},), "4", "h1")


def rollout(mask: tuple[int, ...], reward: float) -> Rollout:
    n = len(mask)
    return Rollout(TASK.id, (1, 2), tuple(range(10, 10 + n)), (-0.5,) * n, "x", TASK.messages, version=0,
                   loss_mask=mask, reward=reward)


def test_gae_puts_the_reward_on_the_last_trained_token_and_leaves_advantages_to_the_critic():
    group = GRPO("gae").assign(TASK, [[rollout((1, 1, 1), 1.0)], [rollout((1, 1, 0, 0), 0.5)],
                                      [rollout((0, 0), 1.0)]])
    streams = [r.token_rewards for r in group.rollouts]
    # Trailing environment tokens (mask 0) get nothing; a rollout with no trained token has no reward to place.
    assert streams == [(0.0, 0.0, 1.0), (0.0, 0.5, 0.0, 0.0), (0.0, 0.0)]
    assert all(r.advantages is None for r in group.rollouts)
    for i, r in enumerate(group.rollouts):
        check_credit(i, r)  # rl tokens with token rewards are trainable by a critic


def test_algo_weight_scales_the_rl_tokens_of_critic_credit():
    group = GRPO("gae").with_weight(0.5).credit(TASK, [[rollout((1, 1, 0), 1.0)]])
    assert group.rollouts[0].rl_weights == (0.5, 0.5, 0.0)  # the loss mask spelled out, then scaled


def test_gae_needs_a_critic_but_no_group():
    algo = GRPO("gae")
    assert algo.needs_critic and not algo.group_relative
    algo.check(group_k=1)  # one sample per row is fine: the critic is the baseline
    assert Echo("gae").needs_critic and not GRPO("grpo").needs_critic


def test_gae_refuses_an_episode_of_several_segments():
    with pytest.raises(RLLoopError, match=r"row 'row-1': an episode of 2 training segments"):
        GRPO("gae").assign(TASK, [[rollout((1,), 0.0), rollout((1,), 1.0)]])


def test_a_rollout_with_both_advantages_and_token_rewards_is_refused():
    import dataclasses

    r = dataclasses.replace(rollout((1, 1), 1.0), advantages=(1.0, 1.0), token_rewards=(0.0, 1.0))
    with pytest.raises(RLLoopError, match="both advantages and token_rewards"):
        check_credit(0, r)


def test_the_loop_refuses_gae_with_a_trainer_without_a_critic():
    config = GRPOConfig(advantage="gae", group_k=2, tasks_per_step=2, corpus_min=20, max_steps=1)
    with pytest.raises(RLLoopError, match=r"loop.advantage = 'gae'.*FakeTrainer\) has none"):
        RLLoop.from_reward(config, exact_match, make_rows(40), trainer=FakeTrainer(),
                           heldout_eval=ScriptedEvaluator(0.1), algorithm=GRPO("gae"))
