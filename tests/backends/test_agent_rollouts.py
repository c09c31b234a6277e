"""Agent rollouts (``[task] agent``) through the recording proxy with a scripted generator: plain and
async agents written against the openai client, what each result shape scores, segments in the
order the stream expects, an agent that never calls the model, one that outlives its episode, and
the record line of each episode."""

from __future__ import annotations

import asyncio
import json
import threading

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("transformers")
openai = pytest.importorskip("openai")

from rlvr.backends.proxy.app import AgentProxy  # noqa: E402
from rlvr.errors import AgentError  # noqa: E402
from rlvr.protocols import RolloutSetup  # noqa: E402
from rlvr.rollouts.agents import agent_rollout  # noqa: E402
from rlvr.rollouts.episodes import bounded  # noqa: E402
from rlvr.seeding import derive_seed  # noqa: E402
from rlvr.types import Rollout, RolloutRequest, SamplingParams, Task  # noqa: E402
from support.chatml import ScriptedGenerator, smollm2_tokenizer  # noqa: E402

TASK = Task("r7", ({"role": "user", "content": "2+3="},), "5", "h")


class Tok:
    """The rollout's ChatTokenizer view (decode only is used)."""

    def __init__(self, hf):
        self.hf = hf

    def decode(self, ids):
        return self.hf.decode(list(ids), skip_special_tokens=True)


@pytest.fixture(scope="module")
def tok():
    return smollm2_tokenizer()


@pytest.fixture()
def proxy(tok, tmp_path):
    p = AgentProxy(tok, max_len=2048, record=tmp_path / "sessions.jsonl")
    yield p
    p.stop()


def play(proxy, tok, agent, reply=lambda prompt: "5", request=None, timeout_s=30.0):
    gen = ScriptedGenerator(tok, reply, version=3)
    setup = RolloutSetup(generator=gen, tokenizer=Tok(tok), params=SamplingParams(max_tokens=16, temperature=0.7))
    fn = bounded(agent_rollout(setup, agent, proxy), timeout_s)
    return asyncio.run(fn(request or RolloutRequest(TASK, 1, 3, 1234))), gen


def ask_twice(base_url, row):
    """An agent: asks, then asks to confirm in the same chat; answers with the last reply."""
    client = openai.OpenAI(base_url=base_url, api_key="x", max_retries=0)
    messages = [{"role": "user", "content": row["prompt"]}]
    for follow_up in ("Sure?", None):
        text = client.chat.completions.create(model="policy", messages=messages).choices[0].message.content
        messages.append({"role": "assistant", "content": text})
        if follow_up:
            messages.append({"role": "user", "content": follow_up})
    return text


def test_a_plain_agent_is_one_sample_scored_on_its_answer(proxy, tok, tmp_path):
    out, gen = play(proxy, tok, ask_twice)
    assert isinstance(out, Rollout)  # two calls, one segment
    assert out.messages == ({"role": "user", "content": "2+3="}, {"role": "assistant", "content": "5"})
    assert out.version == 3 and out.reward is None and sum(out.mask) == 4  # "5<|im_end|>" twice
    assert [seed for _, _, seed in gen.seen] == [derive_seed(1234, "call", 0), derive_seed(1234, "call", 1)]
    [line] = [json.loads(x) for x in (tmp_path / "sessions.jsonl").read_text().splitlines()]
    assert line["row"] == "r7" and line["sample"] == 1 and line["phase"] == "train"
    assert [c["kind"] for c in line["calls"]] == ["new", "append"] and len(line["segments"]) == 1


def test_an_async_agent_returning_none_is_scored_on_its_last_conversation(proxy, tok):
    async def agent(base_url, row):
        client = openai.AsyncOpenAI(base_url=base_url, api_key="x", max_retries=0)
        await client.chat.completions.create(model="policy", messages=[{"role": "user", "content": "warm up"}])
        await client.chat.completions.create(model="policy", messages=[{"role": "user", "content": row["prompt"]}])

    out, _ = play(proxy, tok, agent)
    assert isinstance(out, list) and len(out) == 2  # a fresh context: two segments, the episode's last
    assert out[-1].messages == ({"role": "user", "content": "2+3="}, {"role": "assistant", "content": "5"})
    assert out[0].messages[0]["content"] == "warm up"


def test_a_dict_result_carries_the_agents_reward_and_metrics(proxy, tok):
    def agent(base_url, row):
        ask_twice(base_url, row)
        return {"answer": "5", "reward": 0.25, "metrics": {"tool_calls": 2}}

    out, _ = play(proxy, tok, agent)
    assert out.reward == 0.25 and out.metrics == {"tool_calls": 2.0}
    assert out.messages[-1] == {"role": "assistant", "content": "5"}


def test_an_agent_that_never_calls_the_model_is_a_sample_error(proxy, tok):
    with pytest.raises(AgentError, match="made no model call"):
        play(proxy, tok, lambda base_url, row: "5")
    with pytest.raises(AgentError, match="returned int"):
        play(proxy, tok, lambda base_url, row: (ask_twice(base_url, row), 5)[1])


def test_an_agent_that_outlives_its_episode_is_refused_afterwards(proxy, tok):
    late: list[BaseException] = []
    done, answered = threading.Event(), threading.Event()

    def slow(base_url, row):
        ask_twice(base_url, row)
        done.wait(10)  # past the episode's bound
        try:
            ask_twice(base_url, row)
        except openai.NotFoundError as exc:
            late.append(exc)
        finally:
            answered.set()

    with pytest.raises(TimeoutError):
        play(proxy, tok, slow, timeout_s=1.0)
    done.set()
    assert answered.wait(120)  # a loaded machine may take its time; the answer is what is checked
    assert late and ("has ended" in str(late[0]) or "is not open" in str(late[0]))


def test_agent_concurrency_bounds_episodes_at_once_and_their_waits_are_not_timed(proxy, tok):
    """Six episodes of 0.4 s each, two at a time, under a 1 s bound: they take three turns (1.2 s of
    wall time for the last) and none times out, since a turn's wait is not the episode's own time."""
    lock, inside, most = threading.Lock(), [0], [0]

    def busy(base_url, row):
        with lock:
            inside[0] += 1
            most[0] = max(most[0], inside[0])
        try:
            threading.Event().wait(0.4)  # a program the agent runs
            return ask_twice(base_url, row)
        finally:
            with lock:
                inside[0] -= 1

    gen = ScriptedGenerator(tok, lambda prompt: "5", version=3)
    setup = RolloutSetup(generator=gen, tokenizer=Tok(tok), params=SamplingParams(max_tokens=16, temperature=0.7))
    fn = bounded(agent_rollout(setup, busy, proxy, max_episodes=2), 1.0)

    async def all_six():
        return await asyncio.gather(*(fn(RolloutRequest(TASK, k, 3, 1234 + k)) for k in range(6)))

    out = asyncio.run(all_six())
    assert len(out) == 6 and all(isinstance(r, Rollout) for r in out)
    assert most[0] == 2


def test_agent_concurrency_refuses_a_task_without_an_agent_before_anything_is_written(tmp_path):
    from rlvr.config.run import load_run_config
    from rlvr.errors import ConfigError
    from rlvr.wiring.plan import plan_run

    cfg = load_run_config(None, ["--task.name=addition", "--task.agent_concurrency=2", "--model.tiny=true"])
    with pytest.raises(ConfigError, match="task.agent_concurrency = 2 bounds agent episodes"):
        plan_run(cfg, tmp_path / "run", log=lambda _m: None)
    assert not (tmp_path / "run").exists()
