"""A real third-party agent, unmodified: the OpenAI Agents SDK (``openai-agents`` on PyPI) runs a tool-using
agent and a follow-up turn through the recording proxy, sampling from ``rlvr serve`` on the real model
(SmolLM2-135M-Instruct, rendered with a ChatML template that reads tools). Every request the SDK
made is captured on its own HTTP client and checked against the proxy's record: the same messages,
the prompt ids that rendering them gives, the answer it read decoded from the recorded completion
ids; and the segments: every call in one, the mask on exactly the calls' generated tokens, log-probs
aligned, the inserted tokens exactly the later prompts' new parts. Slow suite (one server, a few
greedy calls)."""

from __future__ import annotations

import asyncio
import copy
import json

import pytest

pytest.importorskip("torch")
pytest.importorskip("fastapi")
agents = pytest.importorskip("agents")  # openai-agents
httpx = pytest.importorskip("httpx")

from rlvr.backends.model.io import load_tokenizer  # noqa: E402
from rlvr.backends.proxy.app import AgentProxy  # noqa: E402
from rlvr.backends.sample.http import HTTPGenerator  # noqa: E402
from rlvr.backends.serve.process import ServerProcess  # noqa: E402
from rlvr.types import SamplingParams  # noqa: E402
from support.chatml import TOOLS_TEMPLATE, render  # noqa: E402
from support.smollm2_rig import smollm2_dir  # noqa: E402

pytestmark = [pytest.mark.train, pytest.mark.slow]


def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


async def run_agent(base_url: str, exchanges: list[dict]) -> list[str]:
    """The SDK as a user writes it, its client's requests and responses kept on the side."""
    async def keep_request(request: httpx.Request) -> None:
        exchanges.append({"request": json.loads(request.content)})

    async def keep_response(response: httpx.Response) -> None:
        await response.aread()
        exchanges[-1]["response"] = response.json()

    client = agents.AsyncOpenAI(base_url=base_url, api_key="unused", max_retries=0, http_client=httpx.AsyncClient(
        event_hooks={"request": [keep_request], "response": [keep_response]}, timeout=120))
    agents.set_tracing_disabled(True)  # no export to a tracing service
    agent = agents.Agent(name="calculator", instructions="You add numbers with the add tool, then answer briefly.",
                         tools=[agents.function_tool(add)],
                         model=agents.OpenAIChatCompletionsModel(model="policy", openai_client=client),
                         model_settings=agents.ModelSettings(temperature=0.0, max_tokens=40))
    first = await agents.Runner.run(agent, "What is 2 + 3?", max_turns=4)
    follow_up = first.to_input_list() + [{"role": "user", "content": "Thanks. And 4 + 4?"}]
    second = await agents.Runner.run(agent, follow_up, max_turns=4)
    return [str(first.final_output), str(second.final_output)]


def test_the_openai_agents_sdk_through_the_proxy_is_recorded_and_stitched(tmp_path):
    base = smollm2_dir()
    tok = copy.deepcopy(load_tokenizer(str(base)))
    tok.chat_template = TOOLS_TEMPLATE
    proxy = AgentProxy(tok, max_len=2048, record=tmp_path / "sessions.jsonl")
    exchanges: list[dict] = []
    with ServerProcess(base, startup_timeout_s=300, log_path=tmp_path / "serve.log", threads=1) as server:
        try:
            sid, url = proxy.open(HTTPGenerator(server.url, "policy"), SamplingParams(max_tokens=40, temperature=0.0),
                                  seed=0, meta={"agent": "openai-agents"})
            outputs = asyncio.run(run_agent(url, exchanges))
            episode = proxy.close(sid)
        finally:
            proxy.stop()
    assert all(outputs)
    calls = episode.calls
    assert len(calls) == len(exchanges) >= 2  # every request the SDK made, recorded once
    for call, ex in zip(calls, exchanges, strict=True):
        body, answer = ex["request"], ex["response"]
        assert list(call.messages) == body["messages"]
        assert call.prompt_ids == render(tok, body["messages"], tools=body.get("tools"))
        message = answer["choices"][0]["message"]
        text = tok.decode(list(call.completion_ids), skip_special_tokens=True)
        if message.get("tool_calls"):
            assert [json.loads(t["function"]["arguments"]) for t in message["tool_calls"]] == \
                [json.loads(t["function"]["arguments"]) for t in call.reply["tool_calls"]]
        else:
            assert message["content"] == text
        assert call.server == server.url
    # Segments: each call in exactly one; masks on the generated tokens only; inserts are the new prompt parts.
    assert sorted(i for s in episode.segments for i in s.calls) == [c.index for c in calls]
    for s in episode.segments:
        mine = [calls[i] for i in s.calls]
        assert [t for t, m in zip(s.completion_ids, s.loss_mask, strict=True) if m] == \
            [t for c in mine for t in c.completion_ids]
        assert [lp for lp, m in zip(s.logprobs, s.loss_mask, strict=True) if m] == \
            [lp for c in mine for lp in c.logprobs]
        assert all(lp == 0.0 for lp, m in zip(s.logprobs, s.loss_mask, strict=True) if not m)
        sequence = list(mine[0].prompt_ids) + list(mine[0].completion_ids)
        for later in mine[1:]:
            assert list(later.prompt_ids[:len(sequence)]) == sequence  # an append extends token by token
            sequence = list(later.prompt_ids) + list(later.completion_ids)
        assert list(s.prompt_ids) + list(s.completion_ids) == sequence
    kinds = [str(t.kind) for t in episode.turns]
    print(f"{len(calls)} SDK calls, turns {kinds}, {len(episode.segments)} segment(s); outputs {outputs}")
    assert kinds[0] == "new" and "append" in kinds, [t.reason for t in episode.turns]
    line = json.loads((tmp_path / "sessions.jsonl").read_text())
    assert line["agent"] == "openai-agents" and line["servers"] == [server.url]
