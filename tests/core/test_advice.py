"""The run's warnings about itself: completions cut by the budget, groups with no reward variance, a
reward that is one value everywhere; each said once, as a warning event and a log line."""

from __future__ import annotations

from conftest import make_rig, small_config
from rlvr.run.advice import RunAdvice
from rlvr.types import Group, Rollout, StopReason, Task


def group(rewards: list[float], cut: int = 0) -> Group:
    task = Task(id="t", messages=({"role": "user", "content": "q"},), answer="a", content_hash="h")
    rollouts = tuple(Rollout(task_id="t", prompt_ids=(1,), completion_ids=(2,), logprobs=(0.0,), text="x",
                             messages=(), reward=r, stop_reason=StopReason.LENGTH if i < cut else StopReason.STOP)
                     for i, r in enumerate(rewards))
    return Group(task=task, rollouts=rollouts)


def advice(window: int = 3) -> tuple[RunAdvice, list[str]]:
    lines: list[str] = []
    return RunAdvice(window, lines.append), lines


def test_more_than_half_truncated_is_said_once_naming_the_key():
    a, lines = advice()
    a.observe(1, [group([0.0, 1.0], cut=1)])  # exactly half: not more than half
    assert a.take_warnings() == []
    a.observe(2, [group([0.0, 1.0], cut=2), group([1.0, 0.0], cut=1)])  # 3 of 4
    a.observe(3, [group([0.0, 1.0], cut=2)])
    [warning] = a.take_warnings()
    assert warning["warning"] == "truncated" and warning["truncated_frac"] == 0.75
    assert "sampler.max_new_tokens" in warning["message"] and len(lines) == 1


def test_a_constant_reward_over_the_window_names_why_nothing_is_learned():
    a, lines = advice()
    for step in (1, 2):
        a.observe(step, [group([0.0, 0.0]), group([0.0, 0.0])])
    assert a.take_warnings() == []  # two steps of three
    a.observe(3, [group([0.0, 0.0])])
    [warning] = a.take_warnings()
    assert warning["warning"] == "constant_reward" and warning["reward"] == 0.0 and warning["steps"] == 3
    assert "steps 1-3: every sample got reward 0" in warning["message"] and "never pays" in warning["message"]
    a.observe(4, [group([0.0, 0.0])])
    assert a.take_warnings() == [] and len(lines) == 1


def test_zero_variance_within_every_group_but_not_constant():
    a, _ = advice(window=2)
    a.observe(1, [group([1.0, 1.0]), group([0.0, 0.0])])
    a.observe(2, [group([0.0, 0.0]), group([1.0, 1.0])])
    [warning] = a.take_warnings()
    assert warning["warning"] == "zero_variance" and "loop.group_k" in warning["message"]


def test_one_varied_group_in_the_window_is_enough_to_stay_quiet():
    a, _ = advice(window=2)
    a.observe(1, [group([1.0, 1.0])])
    a.observe(2, [group([1.0, 0.0])])
    a.observe(3, [group([0.0, 0.0])])
    assert a.take_warnings() == []


def test_the_loop_records_and_logs_the_warning(tmp_path):
    lines: list[str] = []
    rig = make_rig(small_config(max_steps=6, warn_flat_steps=3, heldout_every=3), skill=0.0, out_dir=tmp_path,
                   log=lines.append)  # every completion wrong: reward 0 for every sample
    record = rig.loop.run()
    warnings = [e for e in record.of_kind("warning") if e.data.get("warning") == "constant_reward"]
    assert [e.step for e in warnings] == [3]
    assert lines == [f"rlvr: warning: {warnings[0].data['message']}"]
