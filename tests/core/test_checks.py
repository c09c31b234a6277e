"""Bad sampler output and bad rewards stop the run with the task named, before any training."""

from __future__ import annotations

import dataclasses
import math
import re
from types import SimpleNamespace

import pytest

from conftest import make_rig, small_config
from rlvr import RLLoopError
from rlvr.data.tasks import TaskCursor, load_tasks, split_tasks
from rlvr.rollouts.checks import check_staleness
from rlvr.testing import FakeSampler, FakeTrainer, exact_match


def first_step_tasks(config, rows):
    """The tasks the loop draws at step 1 (same split and cursor as the loop)."""
    train, _ = split_tasks(load_tasks(rows), config.heldout_frac, config.split_salt)
    return TaskCursor(train, config.seed).take(config.tasks_per_step)


class TamperedSampler:
    """A FakeSampler whose output is passed through ``tamper(groups, tasks)``."""

    def __init__(self, inner, tamper):
        self.inner, self.tamper = inner, tamper

    def __call__(self, tasks, k):
        return self.tamper(self.inner(tasks, k), tasks)


def drop_group(groups, tasks):
    return groups[:-1]


def drop_rollout(groups, tasks):
    return [groups[0][:-1], *groups[1:]]


def wrong_task(groups, tasks):
    first = dataclasses.replace(groups[0][0], task_id="other-" + tasks[0].id)
    return [[first, *groups[0][1:]], *groups[1:]]


def short_logprobs(groups, tasks):
    r = groups[0][1]
    return [[groups[0][0], dataclasses.replace(r, logprobs=r.logprobs[:-1])], *groups[1:]]


def short_mask(groups, tasks):
    r = groups[0][0]
    return [[dataclasses.replace(r, loss_mask=(1,) * (len(r.completion_ids) - 1)), *groups[0][1:]], *groups[1:]]


def future_version(groups, tasks):
    return [[dataclasses.replace(r, version=5) for r in g] for g in groups]


def run_with_sampler(sampler_for_trainer, config=None, reward=None):
    trainer = FakeTrainer()
    return make_rig(config or small_config(max_steps=3), trainer=trainer, sampler=sampler_for_trainer(trainer),
                    **({"reward": reward} if reward is not None else {}))


@pytest.mark.parametrize("tamper, pattern", [
    (drop_rollout, r"sampler returned 1 rollouts for task '{t0}', expected 2"),
    (wrong_task, r"rollout for task 'other-{t0}' in the group of '{t0}'"),
    (short_logprobs, r"task '{t0}': rollout has \d+ completion tokens but \d+ logprobs"),
    (short_mask, r"task '{t0}': rollout has \d+ completion tokens .* mask entries"),
    (future_version, r"task '{t0}': rollout sampled under policy version 5 but the policy is at version 0"),
])
def test_bad_sampler_output_names_the_task(tamper, pattern):
    rig = run_with_sampler(lambda trainer: TamperedSampler(FakeSampler(policy=trainer), tamper))
    t0, t1, _ = first_step_tasks(rig.loop.config, rig.rows)
    with pytest.raises(RLLoopError, match=pattern.format(t0=re.escape(t0.id), t1=re.escape(t1.id))):
        rig.loop.run()
    assert rig.trainer.calls == []


def test_wrong_group_count_names_the_counts_and_step():
    rig = run_with_sampler(lambda trainer: TamperedSampler(FakeSampler(policy=trainer), drop_group))
    with pytest.raises(RLLoopError, match=r"sampler returned 0 groups for 1 task"):
        rig.loop.run()
    assert rig.trainer.calls == []


def test_stale_policy_version_is_refused_naming_the_task():
    # The sampler's weights are stuck at the base policy while the trainer moves on.
    rig = run_with_sampler(lambda trainer: FakeSampler(policy=SimpleNamespace(version=0)))
    with pytest.raises(RLLoopError, match=r"task '[^']+': rollout sampled under policy version 0 but the policy "
                                          r"is at version 1 \(allowed offset 0\)"):
        rig.loop.run()
    assert len(rig.trainer.calls) == 1  # step 1 was on-policy; step 2 is refused


def test_allowed_offset_admits_one_step_of_staleness(rows):
    r = FakeSampler(policy=SimpleNamespace(version=3))(load_tasks(rows)[:1], 1)[0][0]
    check_staleness(r, version=4, max_offset=1)  # one version behind, one allowed: trained
    check_staleness(r, version=3, max_offset=0)
    with pytest.raises(RLLoopError, match=rf"task '{r.task_id}': rollout sampled under policy version 3 but the "
                                          r"policy is at version 5 \(allowed offset 1\)"):
        check_staleness(r, version=5, max_offset=1)
    with pytest.raises(RLLoopError, match="version 3 but the policy is at version 2"):
        check_staleness(r, version=2, max_offset=1)  # from the future: never


def test_missing_version_is_stamped_with_the_version_the_row_was_admitted_under():
    # A sampler that cannot tell its version: the stream stamps each sample once, on the way in.
    rig = make_rig(small_config(max_steps=3), sampler=FakeSampler())
    rig.loop.run()
    assert [sorted({r.version for r in call.rollouts}) for call in rig.trainer.calls] == [[0], [1], [2]]
    assert [call.batch.step for call in rig.trainer.calls] == [1, 2, 3]


def test_a_rollout_without_a_version_is_refused_before_training(rows):
    r = FakeSampler()(load_tasks(rows)[:1], 1)[0][0]
    assert r.version is None
    with pytest.raises(RLLoopError, match="carries no policy version"):
        check_staleness(r, version=0, max_offset=0)


def raises(messages, answer):
    raise KeyError("no score")


@pytest.mark.parametrize("reward, pattern", [
    (raises, r"reward_fn of 'raises' raised KeyError: 'no score'"),
    (lambda m, a: math.nan, r"reward_fn of '<lambda>' returned nan \(float\); expected a finite float"),
    (lambda m, a: math.inf, r"reward_fn of '<lambda>' returned inf \(float\); expected a finite float"),
    (lambda m, a: True, r"reward_fn of '<lambda>' returned True \(bool\)"),
    (lambda m, a: "1.0", r"reward_fn of '<lambda>' returned '1.0' \(str\); expected a float, a Score or None"),
])
def test_bad_reward_names_the_row_and_sample(reward, pattern):
    rig = run_with_sampler(lambda trainer: FakeSampler(policy=trainer), reward=reward)
    ids = "|".join(re.escape(t.id) for t in first_step_tasks(rig.loop.config, rig.rows))
    with pytest.raises(RLLoopError, match=rf"row '({ids})' sample \d: {pattern}"):
        rig.loop.run()
    assert rig.trainer.calls == []


def test_reward_sees_the_generated_turn_and_the_answer():
    seen = []

    def reward(messages, answer):
        seen.append((messages[-1]["role"], messages[-1]["content"], answer))
        return exact_match(messages, answer)

    rig = run_with_sampler(lambda trainer: FakeSampler(skill=1.0, policy=trainer), small_config(max_steps=1),
                           reward=reward)
    rig.loop.run()
    assert len(seen) >= 3 * 2 and all(s == ("assistant", s[2], s[2]) for s in seen)  # the stream may sample ahead
    call = rig.trainer.calls[0]
    assert [r.reward for r in call.rollouts] == [1.0] * 6
    assert call.advantages == [0.0] * 6
