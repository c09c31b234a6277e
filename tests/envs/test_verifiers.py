"""verifiers environments, written with verifiers' own API (tests/envs/vf_envs/), run through rlvr.

Loaded the ways users name them (``verifiers:ID``, ``verifiers`` + ``env_id``, a file), with the
real package: lazy datasets, the rubric's components as the score, multi-turn episodes over the
environment's ``env_response`` and stop conditions, tools through the chat template. The model is
scripted (a generator that replays given replies through the tiny model's real tokenizer): the
episode mechanics are under test here, the learning in tests/e2e/test_verifiers_runs.py.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import sys
import threading
from pathlib import Path

import pytest

if importlib.util.find_spec("verifiers") is None or importlib.util.find_spec("datasets") is None:
    pytest.skip("needs the verifiers and datasets packages (pip install 'rlvr[test]')", allow_module_level=True)

from rlvr.envs import environment  # noqa: E402
from rlvr.envs.graders.verifiers_adapter import (  # noqa: E402
    from_verifiers,
    is_verifiers_spec,
    parse_tool_calls,
    unpack_answer,
    verifiers_tasks,
)
from rlvr.errors import ConfigError, MissingExtraError, RewardError  # noqa: E402
from rlvr.protocols import RolloutSetup  # noqa: E402
from rlvr.reward import evaluate_reward  # noqa: E402
from rlvr.rollouts.episodes import multi_turn  # noqa: E402
from rlvr.types import Completion, RolloutRequest, SamplingParams, StopReason, Task  # noqa: E402

ENVS = Path(__file__).parent / "vf_envs"


@pytest.fixture(autouse=True)
def installed(monkeypatch):
    """The test environments importable by name, as an installed environment package is."""
    monkeypatch.syspath_prepend(str(ENVS))
    yield
    for name in ("vf_addition", "vf_guess", "vf_calc"):
        sys.modules.pop(name, None)


def reply(row: dict, text: str) -> list[dict]:
    return [*row["messages"], {"role": "assistant", "content": text}]


def test_a_single_turn_env_by_id_builds_its_lazy_dataset_on_first_use():
    env = environment("verifiers:vf-addition", n=30)
    import vf_addition

    assert env.spec == "verifiers:vf-addition" and not env.multi_turn
    assert vf_addition.builds == []  # loading did not build the dataset
    rows = env.make_rows(5, seed=0)
    assert vf_addition.builds == [30] and len(rows) == 5
    row = rows[0]
    given = unpack_answer(row["answer"])
    question = row["messages"][-1]["content"]
    assert row["messages"] == [{"role": "user", "content": question}]
    assert given["answer"] == str(eval(question[:-1]))  # the dataset's own answer column, a string
    assert given["question"] == question and set(given["info"]) == {"a", "b"}
    right = evaluate_reward(env, reply(row, given["answer"]), row["answer"])
    wrong = evaluate_reward(env, reply(row, "x"), row["answer"])
    assert right.value == 1.0 and wrong.value == 0.0
    # every rubric function is a component (weight 0: a metric), the turn count included
    assert right.metrics == {"correct_answer": 1.0, "is_number": 1.0, "operands_seen": 1.0, "num_turns": 1.0}
    assert wrong.metrics["is_number"] == 0.0 and wrong.metrics["operands_seen"] == 1.0
    assert env.source.sft_answer(row["answer"]) == given["answer"]  # what the warm start teaches


def test_the_other_spellings_load_the_same_environment(tmp_path):
    by_name = environment("verifiers", env_id="vf-addition", n=4)
    assert by_name.source.rows("train")[0]["answer"]["verifiers_input"]["example_id"] == 0
    module = tmp_path / "my_vf_env.py"
    module.write_text((ENVS / "vf_addition.py").read_text())
    from_file = environment(str(module), n=4)  # a file whose load_environment returns a vf env
    assert [r["messages"] for r in from_file.make_rows(4, seed=0)] == [r["messages"] for r in by_name.make_rows(4)]
    with pytest.raises(ConfigError, match="does not accept"):
        environment(str(module), bogus=1)
    with pytest.raises(ConfigError, match="vf-install nope"):
        environment("verifiers:nope")
    with pytest.raises(ConfigError, match=r"task.env_args=\{'bogus': 1\}.*unexpected keyword argument 'bogus'"):
        environment("verifiers:vf-addition", bogus=1)


def test_the_data_uri_reads_either_split_and_reuses_the_run_environment():
    assert is_verifiers_spec("verifiers:vf-addition") and is_verifiers_spec("eval@verifiers:x?limit=2")
    assert not is_verifiers_spec("data/rows.jsonl") and not is_verifiers_spec("train@openai/gsm8k")
    env = environment("verifiers:vf-addition", n=12)
    tasks = verifiers_tasks("verifiers:vf-addition?limit=5", env)
    assert len(tasks) == 5 and isinstance(tasks[0], Task)
    assert [t.messages for t in tasks] == [tuple(r["messages"]) for r in env.make_rows(5)]
    with pytest.raises(ConfigError, match="has no eval dataset"):
        verifiers_tasks("eval@verifiers:vf-addition", env)
    with pytest.raises(ConfigError, match="split must be 'train' or 'eval'"):
        verifiers_tasks("test@verifiers:vf-addition", env)


def test_refusals_name_what_to_do():
    import verifiers as vf
    from datasets import Dataset

    def pairwise(completions) -> list[float]:
        return [0.0] * len(completions)

    data = Dataset.from_list([{"question": "1+1=", "answer": "2"}])
    with pytest.raises(ConfigError, match=r"group-level reward functions \['pairwise'\]"):
        from_verifiers(vf.SingleTurnEnv(dataset=data, rubric=vf.Rubric(funcs=[pairwise])))
    with pytest.raises(ConfigError, match="not a classic verifiers environment"):
        from_verifiers(object())
    with pytest.raises(ConfigError, match="only used when loading an environment by id"):
        from_verifiers(vf.SingleTurnEnv(dataset=data), seed=1)


def test_tool_calls_are_read_in_the_hermes_format():
    content, calls = parse_tool_calls('let me add <tool_call>{"name": "add", "arguments": {"a": 1}}</tool_call>', 3)
    assert content == "let me add" and calls == [{"id": "call_3_0", "name": "add", "arguments": '{"a": 1}'}]
    assert parse_tool_calls("<tool_call>not json</tool_call>", 0) == ("<tool_call>not json</tool_call>", [])


# ------------------------------------------------------------------------------- episodes


class Scripted:
    """A generator replaying ``replies`` in order through a real tokenizer (ids, EOS, log-prob 0)."""

    def __init__(self, tokenizer, replies):
        self.tokenizer, self.replies, self.prompts = tokenizer, list(replies), []

    async def generate(self, prompt_ids, params, *, seed):
        self.prompts.append(self.tokenizer.decode(list(prompt_ids), skip_special_tokens=False))
        ids = (*self.tokenizer(self.replies.pop(0), add_special_tokens=False)["input_ids"],
               self.tokenizer.eos_token_id)
        return Completion(tuple(ids), (0.0,) * len(ids), StopReason.STOP)


def run_episode(env, tokenizer, replies, row):
    from rlvr.backends.model.tokenizer import HFChatTokenizer

    generator = Scripted(tokenizer, replies)
    chat = HFChatTokenizer(tokenizer).with_tools(env.source.tool_schemas)
    setup = RolloutSetup(generator=generator, tokenizer=chat, env=env, params=SamplingParams(max_tokens=64))
    task = Task("t", tuple(row["messages"]), row["answer"], "h", row["info"])
    rollout = asyncio.run(multi_turn(setup, max_turns=env.source.default_max_turns)(RolloutRequest(task, 0, 0, 1)))
    return rollout, generator


def mask_of(rollout, tokenizer, piece: str) -> set[int]:
    """The loss-mask values of the completion tokens that spell ``piece`` (its first occurrence)."""
    tokens = tokenizer.convert_ids_to_tokens(list(rollout.completion_ids))
    starts = [sum(len(t) for t in tokens[:i]) for i in range(len(tokens) + 1)]
    at = "".join(tokens).index(piece)
    first, last = starts.index(at), starts.index(at + len(piece))
    return set(rollout.loss_mask[first:last])


@pytest.fixture
def tiny_tokenizer():
    pytest.importorskip("torch")
    from rlvr.backends.model.tiny import build_tokenizer

    return build_tokenizer()


def test_a_multi_turn_env_runs_its_own_turns_and_stop_condition(tiny_tokenizer):
    env = environment("verifiers:vf-guess", max_turns=3)
    assert env.multi_turn and env.source.default_max_turns == 3
    row = env.make_rows(1)[0]  # 3+4= -> 7
    rollout, generator = run_episode(env, tiny_tokenizer, ["5", "9", "7"], row)
    roles = [m["role"] for m in rollout.messages]
    assert roles == ["user", "assistant", "user", "assistant", "user", "assistant"]
    assert [m["content"] for m in rollout.messages[2::2]] == ["higher", "lower"]
    assert len(generator.prompts) == 3
    # the environment's messages are in the episode's tokens with loss mask 0, the model's with 1
    assert mask_of(rollout, tiny_tokenizer, "<|user|>higher") == {0}
    assert mask_of(rollout, tiny_tokenizer, "<|user|>lower") == {0}
    assert sum(rollout.loss_mask) == 3 * 2  # three one-character replies, each with its EOS
    score = evaluate_reward(env, list(rollout.messages), row["answer"])
    assert score.value == 1.0 and score.metrics["num_turns"] == 3.0 and score.metrics["hints"] == 2.0


def test_the_turn_cap_and_a_wrong_final_reply(tiny_tokenizer):
    env = environment("verifiers:vf-guess", max_turns=2)
    row = env.make_rows(1)[0]
    rollout, generator = run_episode(env, tiny_tokenizer, ["1", "2"], row)
    assert len(generator.prompts) == 2 and [m["role"] for m in rollout.messages][-1] == "assistant"
    score = evaluate_reward(env, list(rollout.messages), row["answer"])
    assert score.value == 0.0 and score.metrics["num_turns"] == 2.0 and score.metrics["hints"] == 1.0


TOOLS_TEMPLATE = (
    "{{ bos_token }}{% if tools %}{{ '<|system|>tools:' }}{% for t in tools %}{{ t['function']['name'] }}"
    "{% endfor %}{{ eos_token }}{% endif %}"
    "{% for message in messages %}{{ '<|' + message['role'] + '|>' + message['content'] + eos_token }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>' }}{% endif %}"
)


def test_a_tool_env_calls_its_tools_and_renders_them_through_the_chat_template(tiny_tokenizer):
    env = environment("verifiers:vf-calc")
    schemas = env.source.tool_schemas
    assert [s["function"]["name"] for s in schemas] == ["add"]
    assert schemas[0]["function"]["parameters"]["properties"]["a"]["type"] == "integer"
    from rlvr.backends.model.tokenizer import HFChatTokenizer

    with pytest.raises(ConfigError, match=r"tools \['add'\].*never reads `tools`"):
        HFChatTokenizer(tiny_tokenizer).with_tools(schemas)  # the tiny template has no tools
    tiny_tokenizer.chat_template = TOOLS_TEMPLATE
    row = env.make_rows(1)[0]
    call = '<tool_call>{"name": "add", "arguments": {"a": 412, "b": 37}}</tool_call>'
    rollout, generator = run_episode(env, tiny_tokenizer, [call, "449"], row)
    assert generator.prompts[0].startswith("<bos><|system|>tools:add<eos><|user|>412+37=")
    tool = rollout.messages[2]
    assert tool == {"role": "tool", "content": "449", "tool_call_id": "call_1_0"}
    assert rollout.messages[1]["content"] == call  # the model's own text stays as sampled
    assert mask_of(rollout, tiny_tokenizer, "<|tool|>449") == {0}
    assert mask_of(rollout, tiny_tokenizer, '"b": 37}}</tool_call>') == {1}
    score = evaluate_reward(env, list(rollout.messages), row["answer"])
    assert score.value == 1.0
    assert {k: score.metrics[k] for k in ("num_turns", "total_tool_calls", "add_calls")} == \
        {"num_turns": 2.0, "total_tool_calls": 1.0, "add_calls": 1.0}
    json.dumps(rollout.messages)  # the episode stays plain JSON


# ------------------------------------------------------------------------------- plumbing


def slow_env(seconds: float):
    import verifiers as vf
    from datasets import Dataset

    async def slow(completion) -> float:
        await asyncio.sleep(seconds)
        return 1.0

    return vf.SingleTurnEnv(dataset=Dataset.from_list([{"question": "q", "answer": "a"}]),
                            rubric=vf.Rubric(funcs=[slow]))


def test_scoring_works_from_threads_and_inside_a_running_event_loop():
    adapter = from_verifiers(slow_env(0.0))
    convo = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]

    async def main():
        blocking = adapter.reward_fn(convo, "a").value  # blocks this loop briefly, but works
        return blocking, (await adapter.ascore(convo, "a")).value

    assert asyncio.run(main()) == (1.0, 1.0)
    out = []
    thread = threading.Thread(target=lambda: out.append(adapter.reward_fn(convo, "a").value))
    thread.start()
    thread.join(30)
    assert out == [1.0]
    adapter.close()


def test_a_rubric_past_its_timeout_is_a_reward_error():
    adapter = from_verifiers(slow_env(5.0), timeout=0.2)
    convo = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]
    with pytest.raises(RewardError, match="TimeoutError.*did not finish within 0.2s"):
        evaluate_reward(adapter, convo, "a")
    adapter.close()


def test_loading_by_id_needs_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "verifiers", None)
    with pytest.raises(MissingExtraError, match=r"rlvr\[verifiers\]"):
        from_verifiers("gsm8k")
