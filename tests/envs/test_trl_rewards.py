"""Rewards that see the row, TRL batch rewards through the trl: adapter, weighted sums, and the math
grader from a plain script (torch-free)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from rlvr.data.fields import FieldMap, make_extractor
from rlvr.data.readers import read_tasks
from rlvr.envs import environment
from rlvr.envs.loading import load_environment
from rlvr.envs.trl import TrlReward, rewards_env
from rlvr.errors import ConfigError, RewardError
from rlvr.reward import evaluate_reward, reward_form
from rlvr.types import Task
from support.child_env import python_path

HERE = Path(__file__).parent
REWARDS = HERE / "trl_style_rewards.py"
sys.path.insert(0, str(HERE))
import trl_style_rewards as trl_rewards  # noqa: E402


def reply(task: Task, text: str) -> list[dict]:
    return [*task.messages, {"role": "assistant", "content": text}]


def trl_rows() -> list[Task]:
    rows = [{"prompt": [{"role": "user", "content": f"{i}+{i}?"}], "solution": str(2 * i), "level": i % 2}
            for i in range(3)]
    return read_tasks(rows, fields=FieldMap({"answer": "solution"}))


# ---------------------------------------------------------------------------- the reward's row


def test_a_reward_sees_the_row_by_its_signature():
    (task,) = read_tasks([{"question": "q", "answer": "#### 7", "unit": "cm"}],
                         fields=FieldMap({"prompt": "question"}, make_extractor("####"), "####"))
    seen = {}

    def with_info(messages, answer, info):
        seen["info"] = info
        return 1.0

    def with_row(messages, answer, **row):
        seen["row"] = row
        return 0.5

    assert reward_form(with_info) == "info" and reward_form(with_row) == "row"
    assert reward_form(lambda messages, answer, scale=2: 0.0) == "plain"
    assert evaluate_reward(load_environment(with_info), reply(task, "7"), task.answer, task).value == 1.0
    assert seen["info"] == {"answer": "#### 7", "unit": "cm"}
    assert evaluate_reward(load_environment(with_row), reply(task, "7"), task.answer, task).value == 0.5
    assert seen["row"] == {"unit": "cm"}  # 'answer' is the positional answer, not a keyword
    assert evaluate_reward(with_info, reply(task, "7"), "7").value == 1.0 and seen["info"] == {}


def test_a_trl_reward_without_the_prefix_is_refused_at_load_naming_the_fix():
    with pytest.raises(ConfigError, match=r"takes 'completions'.*'trl:' prefix"):
        load_environment(trl_rewards.accuracy_reward)  # passed the arity check, then died with KeyError: 0
    with pytest.raises(ConfigError, match=r"takes 'completions'.*'trl:' prefix"):
        load_environment(f"{REWARDS}:short_reward")  # was refused with no way forward


# ---------------------------------------------------------------------- TRL's calling convention


def call_as_trl_grpo_trainer(reward_func, inputs, completions_text, completion_ids, conversational):
    """What TRL's GRPOTrainer._calculate_rewards does for a reward function, written from its documented
    convention: every column but prompt/completion/completion_ids repeated per sample, as keywords."""
    prompts = [x["prompt"] for x in inputs]
    completions = ([[{"role": "assistant", "content": c}] for c in completions_text] if conversational
                   else list(completions_text))
    keys = [key for key in inputs[0] if key not in ("prompt", "completion", "completion_ids")]
    reward_kwargs = {key: [example[key] for example in inputs] for key in keys}
    out = reward_func(prompts=prompts, completions=completions, completion_ids=completion_ids, **reward_kwargs)
    return [float("nan") if r is None else r for r in out]


def test_the_same_trl_reward_in_trl_s_convention_and_through_rlvr():
    inputs = [{"prompt": [{"role": "user", "content": "1+1?"}], "solution": "2"},
              {"prompt": [{"role": "user", "content": "2+2?"}], "solution": "4"}]
    in_trl = call_as_trl_grpo_trainer(trl_rewards.accuracy_reward, inputs, ["2", "5"], [[7], [8]], True)
    assert in_trl == [1.0, 0.0]
    env = environment(f"trl:{REWARDS}:accuracy_reward")
    tasks = read_tasks(inputs, fields=FieldMap({"answer": "solution"}))
    in_rlvr = [evaluate_reward(env, reply(t, text), t.answer, t).value for t, text in zip(tasks, ["2", "5"],
                                                                                               strict=True)]
    assert in_rlvr == in_trl


def test_standard_rows_give_strings_and_none_does_not_apply():
    inputs = [{"prompt": "say hi", "answer": "hi"}, {"prompt": "say nothing", "answer": ""}]
    in_trl = call_as_trl_grpo_trainer(trl_rewards.short_reward, inputs, ["hello", ""], [[1], []], False)
    env = environment(f"trl:{REWARDS}:short_reward")
    (task,) = read_tasks(inputs[:1])
    assert not task.conversational
    assert evaluate_reward(env, reply(task, "hello"), task.answer, task).value == in_trl[0] == -0.5
    assert evaluate_reward(env, reply(task, ""), task.answer, task).value is None


def test_trl_adapter_refusals():
    def needs_ids(completions, completion_ids, **kwargs):
        return [0.0]

    with pytest.raises(ConfigError, match="requires 'completion_ids'"):
        TrlReward(needs_ids, "needs_ids")
    with pytest.raises(ConfigError, match="takes completions="):
        TrlReward(lambda messages, answer: 0.0, "plain")
    env = environment(f"trl:{REWARDS}:accuracy_reward")
    (task,) = trl_rows()[:1]
    with pytest.raises(RewardError, match="no assistant message"):
        evaluate_reward(env, list(task.messages), task.answer, task)


# ---------------------------------------------------------------------- several rewards, weighted


def test_several_rewards_are_a_weighted_score_with_one_component_each():
    env = rewards_env([f"trl:{REWARDS}:accuracy_reward", f"trl:{REWARDS}:digits_reward", "exact_match"],
                      [1.0, 0.5, 2.0], load=environment)
    task = trl_rows()[2]
    result = evaluate_reward(env, reply(task, "4"), task.answer, task)
    assert result.metrics["accuracy_reward"] == 1.0 and result.metrics["digits_reward"] == 1.0
    assert result.value == pytest.approx(1.0 + 0.5 + 2.0)
    wrong = evaluate_reward(env, reply(task, "x"), task.answer, task)
    assert wrong.value == 0.0 and wrong.metrics["exact_match/parsed"] == 1.0
    with pytest.raises(ConfigError, match="2 weights for 3 rewards"):
        rewards_env(["exact_match"] * 3, [1.0, 2.0], load=environment)


def test_none_adds_nothing_and_all_none_does_not_apply():
    env = rewards_env([f"trl:{REWARDS}:short_reward", f"trl:{REWARDS}:digits_reward"], [1.0, 1.0])
    (task,) = read_tasks([{"prompt": "p", "answer": "1"}])
    empty = evaluate_reward(env, reply(task, ""), task.answer, task)
    assert empty.value == 0.0 and "short_reward" not in empty.metrics
    only_none = rewards_env([f"trl:{REWARDS}:short_reward"])
    assert evaluate_reward(only_none, reply(task, ""), task.answer, task).value is None


# ------------------------------------------------------------------------- math from a plain script


@pytest.mark.skipif(importlib.util.find_spec("math_verify") is None, reason="needs the math extra")
def test_math_env_works_from_a_plain_script_without_a_main_guard(tmp_path):
    script = tmp_path / "plain.py"
    script.write_text(textwrap.dedent("""
        from rlvr.envs import environment
        env = environment("math")
        score = env.reward_fn([{"role": "user", "content": "1/2?"},
                               {"role": "assistant", "content": "\\\\boxed{0.5}"}], "\\\\frac{1}{2}")
        print("RUNS", score.value)
    """))
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=240,
                          env={"PYTHONPATH": python_path(), "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["RUNS", "1.0"]  # once: the worker never re-ran the script


def test_a_row_reward_gets_every_column_by_keyword_its_named_parameters_included():
    from rlvr.reward import call_reward
    from rlvr.types import Task

    seen: dict = {}

    def reward(messages, answer, data_source=None, **row):
        seen.update(data_source=data_source, **row)
        return 1.0

    task = Task("t", ({"role": "user", "content": "q"},), "4", "h", info={"data_source": "gsm", "level": 3})
    assert call_reward(reward, [{"role": "assistant", "content": "4"}], "4", task) == 1.0
    assert seen == {"data_source": "gsm", "level": 3}
