"""rlvr serve as OpenAI-compatible clients use it: streaming, /v1/models/{id}, vLLM's defaults,
the sampling fields it honours, tools through a Hermes-style chat template, and a 400 naming every
field it does not implement, all through the official openai client."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("torch")
pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
httpx = pytest.importorskip("httpx")
openai = pytest.importorskip("openai")

import torch  # noqa: E402

from rlvr.backends.model.io import load_model, load_tokenizer  # noqa: E402
from rlvr.backends.model.tiny import build_tiny_model  # noqa: E402
from rlvr.backends.serve.app import ModelHost, serve_in_thread  # noqa: E402
from rlvr.backends.serve.process import free_port  # noqa: E402

pytestmark = pytest.mark.train
NAME = "tiny-tools"
# A Hermes / Qwen-style template: tools listed in a system turn, calls written as <tool_call>{json}</tool_call>.
HERMES = (
    "{{ bos_token }}"
    "{% if tools %}<|system|>tools:{% for t in tools %} {{ t.function.name }}{% endfor %}{{ eos_token }}{% endif %}"
    "{% for m in messages %}{{ '<|' + m.role + '|>' + m.content }}"
    "{% for c in m.tool_calls or [] %}<tool_call>{{ {'name': c.function.name, 'arguments': c.function.arguments}"
    " | tojson }}</tool_call>{% endfor %}{{ eos_token }}{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
PLAIN = ("{{ bos_token }}{% for m in messages %}{{ '<|' + m.role + '|>' + m.content + eos_token }}{% endfor %}"
         "{% if add_generation_prompt %}<|assistant|>{% endif %}")
TOOLS = [{"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}]
ASK = [{"role": "user", "content": "1+2?"}]
CALL = '<tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}</tool_call>'


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """A tiny model taught to answer ASK (with TOOLS) with CALL: a few hundred steps on one sequence."""
    folder = build_tiny_model(tmp_path_factory.mktemp("tools") / "m", hidden=32, layers=2, heads=2, seed=0)
    tokenizer = load_tokenizer(str(folder))
    tokenizer.chat_template = HERMES
    tokenizer.save_pretrained(str(folder))
    prompt = tokenizer.apply_chat_template(ASK, tools=TOOLS, tokenize=False, add_generation_prompt=True)
    p = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    target = tokenizer(CALL, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    model = load_model(str(folder))
    ids = torch.tensor([p + target])
    labels = torch.tensor([[-100] * len(p) + target])
    torch.manual_seed(0)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model.train()
    for _ in range(300):
        out = model(input_ids=ids, labels=labels)
        # Every target token the argmax given the ones before it: greedy decoding writes CALL.
        if out.logits[0, len(p) - 1:-1].argmax(-1).tolist() == target:
            break
        optimizer.zero_grad()
        out.loss.backward()
        optimizer.step()
    model.save_pretrained(str(folder))
    return folder


@pytest.fixture(scope="module")
def tokenizer(model_dir):
    return load_tokenizer(str(model_dir))


@pytest.fixture(scope="module")
def url(model_dir):
    with serve_in_thread(ModelHost(model_dir, served_model_name=NAME), port=free_port()) as url:
        yield url


@pytest.fixture(scope="module")
def client(url):
    return openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=120)


def _by_index(chunks):
    out: dict[int, list] = {}
    for chunk in chunks:
        for choice in chunk.choices:
            out.setdefault(choice.index, []).append(choice)
    return out


# ---- streaming ----------------------------------------------------------------------------------
def test_streamed_chat_assembles_to_the_whole_answer(client):
    ask = dict(model=NAME, messages=[{"role": "user", "content": "hello"}], max_tokens=12, temperature=0,
               logprobs=True, extra_body={"return_token_ids": True})
    whole = client.chat.completions.create(**ask).model_dump()
    chunks = list(client.chat.completions.create(**ask, stream=True, stream_options={"include_usage": True}))
    assert all(c.object == "chat.completion.chunk" and c.id == chunks[0].id for c in chunks)
    choice = whole["choices"][0]
    parts = _by_index(chunks)[0]
    assert parts[0].delta.role == "assistant"
    assert "".join(p.delta.content or "" for p in parts) == choice["message"]["content"]
    assert [p.finish_reason for p in parts[:-1]] == [None] * (len(parts) - 1)
    assert parts[-1].finish_reason == choice["finish_reason"]
    streamed = [e for p in parts if p.logprobs for e in p.logprobs.model_dump()["content"]]
    assert [e["logprob"] for e in streamed] == [e["logprob"] for e in choice["logprobs"]["content"]]
    assert [t for p in parts for t in (p.model_dump().get("token_ids") or [])] == choice["token_ids"]
    assert chunks[0].model_dump()["prompt_token_ids"] == whole["prompt_token_ids"]
    # include_usage: usage null on every chunk but a last one with no choices
    assert all(c.usage is None for c in chunks[:-1])
    assert chunks[-1].choices == [] and chunks[-1].usage.model_dump() == whole["usage"]


def test_streamed_completions_with_n_give_each_choice_its_index(client):
    ask = dict(model=NAME, prompt="abc", max_tokens=8, n=3, seed=11, temperature=1.0, logprobs=1)
    whole = client.completions.create(**ask).model_dump()
    chunks = list(client.completions.create(**ask, stream=True))
    assert all(c.object == "text_completion" and c.usage is None for c in chunks)
    parts = _by_index(chunks)
    assert sorted(parts) == [0, 1, 2]
    for index, choice in enumerate(whole["choices"]):
        assert "".join(p.text for p in parts[index]) == choice["text"]
        assert parts[index][-1].finish_reason == choice["finish_reason"]
        assert [lp for p in parts[index] for lp in p.logprobs.token_logprobs] == \
            choice["logprobs"]["token_logprobs"]
    assert chunks[0].choices[0].index == 0 and chunks[1].choices[0].index == 1  # choices interleave


def test_stream_is_server_sent_events_ending_in_done(url):
    r = httpx.post(f"{url}/v1/completions", json={"model": NAME, "prompt": "ab", "max_tokens": 3, "stream": True,
                                                  "logprobs": 1, "stream_options": {"include_usage": True}},
                   timeout=60)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    events = [line for line in r.text.split("\n\n") if line]
    assert events[-1] == "data: [DONE]" and all(e.startswith("data: ") for e in events)
    chunks = [json.loads(e[len("data: "):]) for e in events[:-1]]
    streamed = sum(len(c["logprobs"]["token_logprobs"]) for chunk in chunks[:-1] for c in chunk["choices"])
    last = chunks[-1]  # usage comes alone, after the tokens (an early eos may end them before 3)
    assert last["choices"] == [] and last["usage"]["completion_tokens"] == streamed and 1 <= streamed <= 3


# ---- models, defaults and honoured fields ---------------------------------------------------------
def test_models_by_id(client):
    card = client.models.retrieve(NAME).model_dump()
    assert card["id"] == NAME and card["object"] == "model" and card["max_model_len"] == 256
    with pytest.raises(openai.NotFoundError, match="nope"):
        client.models.retrieve("nope")


def test_max_tokens_defaults_as_vllm(client, tokenizer):
    only_a = [tokenizer.convert_tokens_to_ids("a")]  # eos never allowed: the budget is what stops it
    chat = client.chat.completions.create(model=NAME, messages=[{"role": "user", "content": "hi"}],
                                          extra_body={"allowed_token_ids": only_a})
    assert chat.usage.prompt_tokens + chat.usage.completion_tokens == 256  # the rest of the context
    assert chat.choices[0].message.content == "a" * chat.usage.completion_tokens
    assert chat.choices[0].finish_reason == "length"
    text = client.completions.create(model=NAME, prompt="hi", logprobs=1, extra_body={"allowed_token_ids": only_a})
    assert text.usage.completion_tokens == 16 and text.choices[0].text == "a" * 16
    # log-probs are of the distribution sampled from: one allowed token has probability 1
    assert text.choices[0].logprobs.token_logprobs == pytest.approx([0.0] * 16, abs=1e-6)


def test_stop_token_ids_and_bad_words(client, tokenizer):
    ask = dict(model=NAME, prompt="abc", max_tokens=12, temperature=0, extra_body={"return_token_ids": True})
    ids = client.completions.create(**ask).model_dump()["choices"][0]["token_ids"]
    stop = ids[3]
    cut = client.completions.create(**{**ask, "extra_body": {"return_token_ids": True, "stop_token_ids": [stop]}})
    choice = cut.model_dump()["choices"][0]
    assert choice["token_ids"] == ids[:ids.index(stop) + 1]
    assert choice["finish_reason"] == "stop" and choice["stop_reason"] == stop
    banned = tokenizer.decode([ids[0]])
    clean = client.completions.create(**{**ask, "extra_body": {"bad_words": [banned]}}).choices[0].text
    assert banned not in clean and clean


def test_chat_rendering_fields(client, tokenizer):
    def prompt_ids(**extra):
        r = client.chat.completions.create(model=NAME, messages=extra.pop("messages", ASK), max_tokens=1,
                                           extra_body={"return_token_ids": True, **extra})
        return r.model_dump()["prompt_token_ids"]

    def rendered(messages, **kw):
        return tokenizer(tokenizer.apply_chat_template(messages, tokenize=False, **kw),
                         add_special_tokens=False)["input_ids"]

    assert prompt_ids() == rendered(ASK, add_generation_prompt=True)
    assert prompt_ids(add_generation_prompt=False) == rendered(ASK, add_generation_prompt=False)
    prefill = [*ASK, {"role": "assistant", "content": "It is"}]
    continued = prompt_ids(messages=prefill, continue_final_message=True, add_generation_prompt=False)
    assert continued == rendered(prefill, continue_final_message=True)
    assert tokenizer.decode(continued).endswith("It is")
    assert prompt_ids(chat_template="{{ messages[0].content }}{{ who }}", chat_template_kwargs={"who": "!"}) == \
        tokenizer("1+2?!", add_special_tokens=False)["input_ids"]
    assert prompt_ids(truncate_prompt_tokens=3) == rendered(ASK, add_generation_prompt=True)[-3:]


# ---- tools ------------------------------------------------------------------------------------------
def test_tool_calls_are_parsed(client):
    r = client.chat.completions.create(model=NAME, messages=ASK, tools=TOOLS, temperature=0)
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    (call,) = choice.message.tool_calls
    assert call.type == "function" and call.function.name == "add"
    assert json.loads(call.function.arguments) == {"a": 1, "b": 2}
    # tool_choice "none": the tools are rendered, the answer is left as text
    plain = client.chat.completions.create(model=NAME, messages=ASK, tools=TOOLS, temperature=0, tool_choice="none")
    assert plain.choices[0].message.content == CALL and plain.choices[0].finish_reason == "stop"


def test_tool_calls_stream(client):
    chunks = list(client.chat.completions.create(model=NAME, messages=ASK, tools=TOOLS, temperature=0, stream=True))
    parts = _by_index(chunks)[0]
    calls = [c for p in parts for c in (p.delta.tool_calls or [])]
    assert [(c.index, c.function.name, json.loads(c.function.arguments)) for c in calls] == \
        [(0, "add", {"a": 1, "b": 2})]
    assert parts[-1].finish_reason == "tool_calls"


def test_a_tool_call_in_the_history_renders_through_the_template(client, tokenizer):
    history = [*ASK, {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call-1", "type": "function", "function": {"name": "add", "arguments": '{"a": 1, "b": 2}'}}]},
        {"role": "tool", "content": "3", "tool_call_id": "call-1"}]
    r = client.chat.completions.create(model=NAME, messages=history, tools=TOOLS, max_tokens=1,
                                       extra_body={"return_token_ids": True})
    assert CALL in tokenizer.decode(r.model_dump()["prompt_token_ids"])


def test_tools_refused_where_the_template_has_no_tool_support(client):
    with pytest.raises(openai.BadRequestError, match="tools") as info:
        client.chat.completions.create(model=NAME, messages=ASK, tools=TOOLS, extra_body={"chat_template": PLAIN})
    assert info.value.body["param"] == "tools"


# ---- refusals ------------------------------------------------------------------------------------------
REFUSED = [
    ("response_format", {"type": "json_object"}), ("guided_json", {"type": "object"}), ("guided_regex", "a+"),
    ("guided_choice", ["a"]), ("guided_grammar", "root ::= 'a'"), ("structural_tag", "{}"),
    ("structured_outputs", {"json": {}}), ("guided_decoding_backend", "xgrammar"),
    ("logits_processors", ["m.P"]), ("logit_bias", {"5": 1.0}), ("presence_penalty", 0.5),
    ("frequency_penalty", 0.5), ("top_k", -2), ("top_k", 1.5), ("min_p", 1.5), ("repetition_penalty", 0),
    ("min_tokens", 2),
    ("ignore_eos", True), ("use_beam_search", True), ("length_penalty", 0.5), ("echo", True),
    ("spaces_between_special_tokens", False), ("priority", 1), ("best_of", 3), ("prompt_embeds", "AAAA"),
    ("mm_processor_kwargs", {"a": 1}), ("cache_salt", "salt"), ("kv_transfer_params", {"a": 1}),
    ("vllm_xargs", {"a": 1}), ("store", True), ("metadata", {"a": "b"}), ("service_tier", "flex"),
    ("stream_options", {"include_usage": True}), ("no_such_field", 1),
]
CHAT_ONLY = [
    ("tool_choice", "required"), ("parallel_tool_calls", False), ("functions", [{"name": "f"}]),
    ("function_call", "auto"), ("audio", {"voice": "x"}), ("modalities", ["audio"]),
    ("prediction", {"type": "content", "content": "x"}), ("reasoning_effort", "low"), ("documents", [{"text": "x"}]),
    ("web_search_options", {}), ("verbosity", "low"), ("include_reasoning", False),
]
COMPLETION_ONLY = [("suffix", "x"), ("prompt_logprobs", 2)]


@pytest.mark.parametrize("endpoint, field, value", [
    *[(e, f, v) for f, v in REFUSED for e in ("chat", "completions")],
    *[("chat", f, v) for f, v in CHAT_ONLY], *[("completions", f, v) for f, v in COMPLETION_ONLY],
])
def test_every_unsupported_field_is_a_400_naming_it(client, endpoint, field, value):
    with pytest.raises(openai.BadRequestError, match=field) as info:
        if endpoint == "chat":
            client.chat.completions.create(model=NAME, messages=ASK, max_tokens=2, tools=TOOLS,
                                           extra_body={field: value})
        else:
            client.completions.create(model=NAME, prompt="ab", max_tokens=2, extra_body={field: value})
    assert info.value.body["param"] == field and info.value.status_code == 400
