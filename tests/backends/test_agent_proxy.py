"""The recording proxy with real clients (openai, anthropic) against a scripted generator over
SmolLM2's tokenizer: what a client reads is what the generator produced, and every call is recorded
with the exact prompt ids (the real ChatML rendering), completion ids, log-probs, version and server,
whole or streamed, chat, completions and Anthropic's Messages; sessions by URL or header; a run's
sampling rule over the agent's; closed and missing sessions refused."""

from __future__ import annotations

import copy
import json

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("transformers")
openai = pytest.importorskip("openai")

from rlvr.backends.proxy.app import AgentProxy  # noqa: E402
from rlvr.rollouts.turns import TurnKind  # noqa: E402
from rlvr.types import SamplingParams, StopReason  # noqa: E402
from support.chatml import TOOLS_TEMPLATE, ScriptedGenerator, render, smollm2_tokenizer  # noqa: E402


@pytest.fixture(scope="module")
def tok():
    return smollm2_tokenizer()


@pytest.fixture(scope="module")
def proxy(tok):
    p = AgentProxy(tok, max_len=2048)
    p.start()
    yield p
    p.stop()


def client(base_url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=30)


def echo(prompt: str) -> str:
    """The "model": answers with the last user message reversed."""
    last = prompt.rsplit("<|im_start|>user\n", 1)[-1].split("<|im_end|>", 1)[0]
    return f"Reversed: {last[::-1]}"


def test_a_chat_call_is_answered_and_recorded_exactly(proxy, tok):
    gen = ScriptedGenerator(tok, echo, version=7)
    sid, url = proxy.open(gen, SamplingParams(max_tokens=64, temperature=0.5), seed=11, meta={"row": "r1"})
    messages = [{"role": "user", "content": "hello"}]
    out = client(url).chat.completions.create(model="anything", messages=messages, temperature=0.0, max_tokens=200)
    assert out.choices[0].message.content == "Reversed: olleh"
    assert out.choices[0].finish_reason == "stop"
    done = proxy.close(sid)
    [call] = done.calls
    assert call.prompt_ids == render(tok, messages) == gen.seen[0][0]
    assert call.completion_ids == (*tok("Reversed: olleh", add_special_tokens=False)["input_ids"], gen.im_end)
    assert call.logprobs == tuple(-1 - k / 100 for k in range(len(call.completion_ids)))
    assert call.version == 7 and call.stop_reason == StopReason.STOP and call.messages == tuple(messages)
    # The run's rule, not the agent's: its temperature, and at most its budget.
    params = gen.seen[0][1]
    assert params.temperature == 0.5 and params.max_tokens == 64
    assert [t.kind for t in done.turns] == [TurnKind.NEW] and len(done.segments) == 1


def test_a_multi_turn_agent_appends_and_a_closed_session_is_refused(proxy, tok):
    gen = ScriptedGenerator(tok, echo)
    sid, url = proxy.open(gen, SamplingParams(max_tokens=64), seed=1)
    c = client(url)
    messages = [{"role": "system", "content": "Reverse things."}, {"role": "user", "content": "abc"}]
    for word in ("de", "fgh"):
        reply = c.chat.completions.create(model="policy", messages=messages).choices[0].message
        messages += [{"role": "assistant", "content": reply.content}, {"role": "user", "content": word}]
    c.chat.completions.create(model="policy", messages=messages)
    done = proxy.close(sid)
    assert [t.kind for t in done.turns] == [TurnKind.NEW, TurnKind.APPEND, TurnKind.APPEND]
    [segment] = done.segments
    generated = [t for call in done.calls for t in call.completion_ids]
    assert [t for t, m in zip(segment.completion_ids, segment.loss_mask, strict=True) if m] == generated
    assert segment.prompt_ids + segment.completion_ids == done.calls[-1].prompt_ids + done.calls[-1].completion_ids
    with pytest.raises(openai.NotFoundError, match="has ended|is not open"):
        c.chat.completions.create(model="policy", messages=messages)


def test_streaming_assembles_to_the_recorded_answer(proxy, tok):
    gen = ScriptedGenerator(tok, echo)
    sid, url = proxy.open(gen, SamplingParams(max_tokens=64), seed=2)
    stream = client(url).chat.completions.create(model="policy", messages=[{"role": "user", "content": "stream"}],
                                                 stream=True, stream_options={"include_usage": True})
    chunks = list(stream)
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert text == "Reversed: maerts"
    assert chunks[-1].usage.completion_tokens == len(proxy.close(sid).calls[0].completion_ids)


def test_tool_calls_come_back_in_the_openai_shape_and_the_next_call_appends(proxy, tok):
    tools_tok = copy.deepcopy(tok)
    tools_tok.chat_template = TOOLS_TEMPLATE
    p = AgentProxy(tools_tok, max_len=2048)
    tools = [{"type": "function", "function": {"name": "add", "parameters": {"type": "object", "properties": {
        "a": {"type": "integer"}, "b": {"type": "integer"}}}}}]

    def model(prompt: str) -> str:
        if "<|im_start|>tool" in prompt:
            return "The sums are 5 and 2."
        return ('<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>\n'
                '<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 1}}\n</tool_call>')

    try:
        sid, url = p.open(ScriptedGenerator(tools_tok, model), SamplingParams(max_tokens=128), seed=3)
        c = client(url)
        messages = [{"role": "user", "content": "2+3 and 1+1?"}]
        first = c.chat.completions.create(model="policy", messages=messages, tools=tools)
        message = first.choices[0].message
        assert first.choices[0].finish_reason == "tool_calls" and message.content is None
        assert [(t.function.name, json.loads(t.function.arguments)) for t in message.tool_calls] == \
            [("add", {"a": 2, "b": 3}), ("add", {"a": 1, "b": 1})]
        messages.append(message.model_dump(exclude_none=True))
        messages += [{"role": "tool", "tool_call_id": t.id, "content": str(sum(json.loads(t.function.arguments)
                                                                                  .values()))}
                     for t in message.tool_calls]
        second = c.chat.completions.create(model="policy", messages=messages, tools=tools)
        assert second.choices[0].message.content == "The sums are 5 and 2."
        done = p.close(sid)
    finally:
        p.stop()
    assert [t.kind for t in done.turns] == [TurnKind.NEW, TurnKind.APPEND]
    inserted = [t for t, m in zip(done.segments[0].completion_ids, done.segments[0].loss_mask, strict=True) if not m]
    assert tools_tok.decode(inserted) == ("\n<|im_start|>tool\n5<|im_end|>\n<|im_start|>tool\n2<|im_end|>\n"
                                          "<|im_start|>assistant\n")


def test_completions_by_header_session_and_n_choices_are_separate_calls(proxy, tok):
    gen = ScriptedGenerator(tok, lambda prompt: "42")
    sid, url = proxy.open(gen, SamplingParams(max_tokens=8), seed=4)
    root = url.rsplit("/s/", 1)[0] + "/v1"
    c = openai.OpenAI(base_url=root, api_key="x", max_retries=0, default_headers={"x-session-affinity": sid})
    out = c.completions.create(model="policy", prompt="6*7=", n=2, logprobs=1)
    assert [ch.text for ch in out.choices] == ["42", "42"]
    done = proxy.close(sid)
    assert [call.index for call in done.calls] == [0, 1]
    assert done.calls[0].messages is None and done.calls[0].prompt_ids == tuple(tok("6*7=")["input_ids"])
    assert len({s for _, _, s in gen.seen}) == 2  # each choice its own seed


def test_a_run_proxy_refuses_calls_without_a_session(proxy):
    c = openai.OpenAI(base_url=proxy.url + "/v1", api_key="x", max_retries=0)
    with pytest.raises(openai.BadRequestError, match="no session"):
        c.chat.completions.create(model="policy", messages=[{"role": "user", "content": "hi"}])
    with pytest.raises(openai.NotFoundError, match="is not open"):
        client(proxy.url + "/s/nobody/v1").chat.completions.create(
            model="policy", messages=[{"role": "user", "content": "hi"}])


def test_an_unhonoured_field_is_refused_by_name(proxy, tok):
    sid, url = proxy.open(ScriptedGenerator(tok, echo), SamplingParams(max_tokens=8), seed=5)
    with pytest.raises(openai.BadRequestError, match="presence_penalty"):
        client(url).chat.completions.create(model="policy", messages=[{"role": "user", "content": "hi"}],
                                            presence_penalty=0.5)
    assert proxy.close(sid).calls == []


def test_the_anthropic_messages_shape(proxy, tok):
    anthropic = pytest.importorskip("anthropic")
    gen = ScriptedGenerator(tok, echo)
    sid, url = proxy.open(gen, SamplingParams(max_tokens=64), seed=6)
    c = anthropic.Anthropic(base_url=url.removesuffix("/v1"), api_key="x", max_retries=0)
    out = c.messages.create(model="policy", max_tokens=50, system="Be brief.",
                            messages=[{"role": "user", "content": "xyz"}])
    assert out.content[0].text == "Reversed: zyx" and out.stop_reason == "end_turn"
    [call] = proxy.close(sid).calls
    assert call.prompt_ids == render(tok, [{"role": "system", "content": "Be brief."},
                                           {"role": "user", "content": "xyz"}])
    assert out.usage.output_tokens == len(call.completion_ids)


def test_idle_connections_are_left_for_the_client_to_close(proxy):
    """The openai client pools connections and drops an idle one after its keep-alive expiry; a proxy
    closing first would reset the client's next request on it (a lost agent call under load)."""
    from openai._constants import DEFAULT_CONNECTION_LIMITS

    proxy.start()
    assert proxy._server.config.timeout_keep_alive > DEFAULT_CONNECTION_LIMITS.keepalive_expiry
