"""Prompt-only rows (TRL's quickstart datasets: no answer column) load when no reward takes an answer,
and are refused naming the row when one does; the completion budget fits the model that is named."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlvr.config.run import BASE_COMPLETION_BUDGET, TINY_COMPLETION_BUDGET, RunConfig, run_config_from_dict
from rlvr.envs.trl import needs_answer, rewards_env
from rlvr.errors import DataError
from rlvr.protocols import LoadedEnv
from rlvr.types import Task

REWARDS = '''
def reward_len(completions, **kwargs):
    assert "answer" not in kwargs  # TRL passes the row's columns: a row without an answer has none
    return [-abs(20 - len(c)) for c in completions]


def exact(messages, answer):
    return float(messages[-1]["content"] == answer)


def lenient(messages, answer=None):
    return float(len(messages[-1]["content"]) < 20)
'''


@pytest.fixture
def files(tmp_path: Path) -> Path:
    (tmp_path / "rewards.py").write_text(REWARDS)
    (tmp_path / "tldr.jsonl").write_text("".join(json.dumps({"prompt": f"POST {i}\nTL;DR:"}) + "\n"
                                                 for i in range(120)))
    return tmp_path


def test_whether_a_reward_takes_an_answer_is_read_from_it(files):
    def env(fn):
        return LoadedEnv(name="r", reward_fn=fn, source=fn)

    assert needs_answer(env(lambda messages, answer: 0.0))
    assert not needs_answer(env(lambda messages, answer=None: 0.0))
    assert not needs_answer(rewards_env([f"trl:{files / 'rewards.py'}:reward_len"]))
    assert needs_answer(rewards_env([f"trl:{files / 'rewards.py'}:reward_len", f"{files / 'rewards.py'}:exact"]))


def test_a_trl_reward_gets_no_answer_keyword_for_a_row_without_one(files):
    env = rewards_env([f"trl:{files / 'rewards.py'}:reward_len"])
    task = Task(id="t", messages=({"role": "user", "content": "POST\nTL;DR:"},), answer=None, content_hash="h",
                conversational=False)
    score = env.reward_fn([*task.messages, {"role": "assistant", "content": "x" * 5}], None, task)
    assert score.value == -15.0


@pytest.mark.train
def test_prompt_only_rows_load_for_a_reward_that_takes_no_answer(files):
    pytest.importorskip("torch")
    from rlvr.wiring.tasks import task_tasks

    data = str(files / "tldr.jsonl")
    for reward in ([f"trl:{files / 'rewards.py'}:reward_len"], [f"{files / 'rewards.py'}:lenient"]):
        tasks, _ = task_tasks(run_config_from_dict({"task": {"data": data, "rewards": reward}}))
        assert len(tasks) == 120 and all(t.answer is None for t in tasks)
    with pytest.raises(DataError, match=r"tldr\.jsonl line 1: field 'answer' is missing"):
        task_tasks(run_config_from_dict({"task": {"data": data, "env": f"{files / 'rewards.py'}:exact"}}))


def test_the_completion_budget_fits_the_model_and_is_saved_resolved():
    assert RunConfig().sampler.max_new_tokens == TINY_COMPLETION_BUDGET == 16
    named = run_config_from_dict({"model": {"base": "org/model"}})
    assert named.sampler.max_new_tokens == BASE_COMPLETION_BUDGET == 256
    assert named.model_dump(mode="json")["sampler"]["max_new_tokens"] == 256  # config.json holds the number
    given = run_config_from_dict({"model": {"base": "org/model"}, "sampler": {"max_new_tokens": 32}})
    assert given.sampler.max_new_tokens == 32
    assert run_config_from_dict(named.model_dump(mode="json")) == named  # a saved config reads back the same
