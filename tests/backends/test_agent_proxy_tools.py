"""Tool calls through the recording proxy: each common family's form read back into the OpenAI shape
(Hermes/Qwen, Llama-3 JSON, Mistral), the family read from the chat template or set by hand, and a
forced ``tool_choice`` ("required", a named function, Anthropic's ``any``) honoured by prefilling the
call's opening, recorded as prompt (never trained)."""

from __future__ import annotations

import copy
import json

import pytest

from rlvr.backends.serve.tool_calls import PARSERS, detect, parser_for

ADD = {"a": 2, "b": 3}


def _calls(parsed):
    content, calls = parsed
    return content, [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls]


def test_hermes_calls_after_text():
    text = 'Let me add.\n<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>'
    assert _calls(PARSERS["hermes"].parse(text)) == ("Let me add.", [("add", ADD)])


def test_llama3_json_calls_with_and_without_the_python_tag():
    one = '{"name": "add", "parameters": {"a": 2, "b": 3}}'
    assert _calls(PARSERS["llama3_json"].parse(one)) == (None, [("add", ADD)])
    two = '<|python_tag|>{"name": "add", "parameters": {"a": 2, "b": 3}}; {"name": "neg", "parameters": {"x": 1}}'
    assert _calls(PARSERS["llama3_json"].parse(two)) == (None, [("add", ADD), ("neg", {"x": 1})])
    prose = 'The answer is {"name": "add"}'
    assert PARSERS["llama3_json"].parse(prose) == (prose, [])


def test_mistral_calls_in_both_forms():
    listed = 'Sure. [TOOL_CALLS] [{"name": "add", "arguments": {"a": 2, "b": 3}}, {"name": "neg", "arguments": {}}]'
    assert _calls(PARSERS["mistral"].parse(listed)) == ("Sure.", [("add", ADD), ("neg", {})])
    named = '[TOOL_CALLS]add[ARGS]{"a": 2, "b": 3}[TOOL_CALLS]neg[ARGS]{}'
    assert _calls(PARSERS["mistral"].parse(named)) == (None, [("add", ADD), ("neg", {})])


@pytest.mark.parametrize("family", sorted(PARSERS))
def test_a_call_that_does_not_parse_is_plain_text(family):
    broken = {"hermes": "<tool_call>{not json</tool_call>", "llama3_json": '{"name": "add", "parameters": ',
              "mistral": '[TOOL_CALLS] [{"name": "add", "arguments": {'}[family]
    assert PARSERS[family].parse(broken) == (broken, [])


@pytest.mark.parametrize("family", sorted(PARSERS))
def test_a_prefilled_opening_completes_into_a_call(family):
    parser = PARSERS[family]
    rest = {"hermes": '{"a": 2, "b": 3}}\n</tool_call>', "llama3_json": '{"a": 2, "b": 3}}',
            "mistral": '{"a": 2, "b": 3}}]'}[family]
    assert _calls(parser.parse(parser.prefill("add") + rest))[1] == [("add", ADD)]
    key = "parameters" if family == "llama3_json" else "arguments"
    assert _calls(parser.parse(parser.prefill(None) + f'add", "{key}": ' + rest))[1] == [("add", ADD)]


def test_the_family_is_read_from_the_template_or_set():
    assert detect("{{ '<tool_call>' }}").name == "hermes"
    assert detect("{{ '[TOOL_CALLS]' }}").name == "mistral"
    assert detect("{{ '<|python_tag|>' }}").name == "llama3_json"
    assert detect("{{ messages }}").name == "hermes"
    assert parser_for("mistral", "{{ '<tool_call>' }}").name == "mistral"
    with pytest.raises(ValueError, match="pythonic"):
        parser_for("pythonic", None)


# ---- through the proxy ---------------------------------------------------------------------------
pytest.importorskip("fastapi")
pytest.importorskip("transformers")
openai = pytest.importorskip("openai")

from rlvr.backends.proxy.app import AgentProxy  # noqa: E402
from rlvr.types import SamplingParams  # noqa: E402
from support.chatml import TOOLS_TEMPLATE, ScriptedGenerator, smollm2_tokenizer  # noqa: E402

TOOLS = [{"type": "function", "function": {"name": "add", "parameters": {"type": "object", "properties": {
    "a": {"type": "integer"}, "b": {"type": "integer"}}}}},
    {"type": "function", "function": {"name": "neg", "parameters": {"type": "object"}}}]


@pytest.fixture(scope="module")
def tools_proxy():
    tok = copy.deepcopy(smollm2_tokenizer())
    tok.chat_template = TOOLS_TEMPLATE
    p = AgentProxy(tok, max_len=2048)
    p.start()
    yield p, tok
    p.stop()


def _finish(prompt: str) -> str:
    """The "model": completes whatever call opening the prompt ends with."""
    if prompt.endswith('{"name": "add", "arguments": '):
        return '{"a": 2, "b": 3}}\n</tool_call>'
    if prompt.endswith('{"name": "'):
        return 'neg", "arguments": {}}\n</tool_call>'
    return "no tools for me"


@pytest.mark.parametrize("choice, expected", [
    ("required", ("neg", {})),
    ({"type": "function", "function": {"name": "add"}}, ("add", ADD)),
])
def test_a_forced_tool_choice_is_prefilled_and_recorded_as_prompt(tools_proxy, choice, expected):
    proxy, tok = tools_proxy
    gen = ScriptedGenerator(tok, _finish)
    sid, url = proxy.open(gen, SamplingParams(max_tokens=64), seed=1)
    client = openai.OpenAI(base_url=url, api_key="unused", max_retries=0, timeout=30)
    out = client.chat.completions.create(model="policy", messages=[{"role": "user", "content": "go"}], tools=TOOLS,
                                         tool_choice=choice)
    message = out.choices[0].message
    assert out.choices[0].finish_reason == "tool_calls"
    assert [(t.function.name, json.loads(t.function.arguments)) for t in message.tool_calls] == [expected]
    [call] = proxy.close(sid).calls
    opening = PARSERS["hermes"].prefill(None if choice == "required" else "add")
    assert tok.decode(call.prompt_ids).endswith("<|im_start|>assistant\n" + opening)
    assert not tok.decode(call.completion_ids).startswith("<tool_call>")  # the opening is never trained


def test_a_named_tool_that_is_not_offered_is_refused_by_name(tools_proxy):
    proxy, tok = tools_proxy
    sid, url = proxy.open(ScriptedGenerator(tok, _finish), SamplingParams(max_tokens=64), seed=2)
    client = openai.OpenAI(base_url=url, api_key="unused", max_retries=0, timeout=30)
    with pytest.raises(openai.BadRequestError, match="tool_choice names the function 'mul'"):
        client.chat.completions.create(model="policy", messages=[{"role": "user", "content": "go"}], tools=TOOLS,
                                       tool_choice={"type": "function", "function": {"name": "mul"}})
    assert proxy.close(sid).calls == []


def test_anthropic_any_is_honoured(tools_proxy):
    anthropic = pytest.importorskip("anthropic")
    proxy, tok = tools_proxy
    sid, url = proxy.open(ScriptedGenerator(tok, _finish), SamplingParams(max_tokens=64), seed=3)
    client = anthropic.Anthropic(base_url=url.removesuffix("/v1"), api_key="unused", max_retries=0)
    out = client.messages.create(model="policy", max_tokens=64, messages=[{"role": "user", "content": "go"}],
                                 tools=[{"name": "neg", "input_schema": {"type": "object"}}],
                                 tool_choice={"type": "any"})
    assert out.stop_reason == "tool_use" and [(b.name, b.input) for b in out.content] == [("neg", {})]
    proxy.close(sid)
