"""``/v1/completions`` and ``/v1/chat/completions``: a parsed request to jobs for the host, and its
samples to a response, whole or streamed (:mod:`rlvr.backends.serve.streaming`).

Invariants: a streamed answer and a whole one are built by the same :func:`finish`, so at the same
seed they carry the same text, tokens and log-probs (and the same most likely tokens, when asked);
every refusal happens before the first byte of an answer (a stream never starts and then fails on
the request's fields). Prompts are tokenized and chat templates rendered in the render pool
(:mod:`~rlvr.backends.serve.render`), never on the event loop.

A backend module: imports fastapi.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Callable
from functools import partial
from typing import Any

from fastapi.responses import StreamingResponse

from rlvr.backends.serve.chat import parse_tool_calls, render
from rlvr.backends.serve.choices import (
    Choice,
    chat_logprobs,
    completion_logprobs,
    finish,
    prompt_logprobs,
    usage,
)
from rlvr.backends.serve.model_host import ModelHost
from rlvr.backends.serve.requests import (
    COMPLETION_MAX_TOKENS,
    ChatBody,
    CompletionBody,
    jobs_of,
    stops_of,
    truncate,
)
from rlvr.backends.serve.streaming import (
    Delta,
    LiveText,
    Shape,
    Stream,
    chat_stream,
    completion_stream,
    listener_for,
    live_deltas,
    sse,
)
from rlvr.errors import RequestError
from rlvr.types import Completion


def _finisher(host: ModelHost, body: CompletionBody | ChatBody) -> Callable[[Completion], Choice]:
    stop_ids = tuple(body.stop_token_ids or ())
    return partial(finish, host.tokenizer, stops=stops_of(body), skip_special_tokens=body.skip_special_tokens,
                   include_stop_str=body.include_stop_str_in_output, stop_token_ids=stop_ids)


def _stream(body: CompletionBody | ChatBody, kind: str, model: str, version: int | None, prompt_tokens: int
            ) -> Stream:
    options = body.stream_options
    return Stream(id=_id(body, kind), object=f"{kind}.chunk" if kind == "chat.completion" else kind,
                  created=int(time.time()), model=model, version=version, prompt_tokens=prompt_tokens,
                  include_usage=bool(options and options.include_usage),
                  continuous_usage=bool(options and options.include_usage and options.continuous_usage_stats))


def _id(body: CompletionBody | ChatBody, kind: str) -> str:
    prefix = "chatcmpl" if kind == "chat.completion" else "cmpl"
    return f"{prefix}-{body.request_id or uuid.uuid4().hex}"


async def _prompts_of(host: ModelHost, body: CompletionBody) -> list[list[int]]:
    prompt = body.prompts()
    if not prompt:
        raise RequestError("prompt is empty", "prompt")
    texts = [p for p in prompt if isinstance(p, str)]
    encoded = iter(await host.renderer.texts(texts, add_special_tokens=body.add_special_tokens, field="prompt")
                   if texts else [])
    ids = [next(encoded) if isinstance(p, str) else list(p) for p in prompt]
    return [truncate(p, body, host.max_len) for p in ids]


def _live(host: ModelHost, body: CompletionBody | ChatBody, adapter: str | None, jobs: list, top_n: int,
          buffered: bool = False) -> AsyncIterator[Delta]:
    """The request's jobs submitted with a listener: their tokens as they are generated."""
    events: asyncio.Queue = asyncio.Queue()
    made = host.submit(adapter, jobs, top_n=top_n, listener=listener_for(events))
    texts = [LiveText(host.tokenizer, _finisher(host, body), stops_of(body), body.skip_special_tokens, buffered)
             for _ in made]
    return live_deltas(made, events, texts)


def _choices(host: ModelHost, body: CompletionBody | ChatBody, outs: list[Completion]) -> list[Choice]:
    return [_finisher(host, body)(out) for out in outs]


async def complete(host: ModelHost, body: CompletionBody) -> dict[str, Any] | StreamingResponse:
    if body.prompt_logprobs not in (None, 0):
        raise RequestError(f"prompt_logprobs={body.prompt_logprobs} is not supported by rlvr serve: only 0 (each "
                           "prompt token's own log-prob) or leaving it out", "prompt_logprobs")
    if body.stream and body.prompt_logprobs is not None:
        raise RequestError("prompt_logprobs is not available with stream=true", "prompt_logprobs")
    adapter = host.resolve(body.model)
    prompts = await _prompts_of(host, body)
    jobs = jobs_of(host, prompts, body, body.max_tokens or COMPLETION_MAX_TOKENS)
    top_n = body.logprobs or 0
    model = body.model or host.name
    shape = Shape(body.logprobs, bool(body.return_tokens_as_token_ids), body.return_token_ids)
    if body.stream:
        stream = _stream(body, "text_completion", model, host.current_version, sum(map(len, prompts)) * body.n)
        deltas = _live(host, body, adapter, jobs, top_n)
        return StreamingResponse(sse(completion_stream(stream, host.tokenizer, deltas, prompts=prompts, n=body.n,
                                                       shape=shape)), media_type="text/event-stream")
    scored = prompts if body.prompt_logprobs is not None else []
    made = host.submit(adapter, list(jobs) + [(p, None, 0) for p in scored], top_n=top_n)
    results = await host.wait(made)
    version = _one_version(results)
    choices = _choices(host, body, [c for c, _ in results[:len(jobs)]])
    per_prompt = [prompt_logprobs(host.tokenizer, p, s) for p, (s, _) in zip(scored, results[len(jobs):], strict=True)]
    rows = []
    for index, c in enumerate(choices):
        row: dict[str, Any] = {"index": index, "text": c.text, "logprobs": None, "finish_reason": c.finish_reason,
                               "stop_reason": c.stop_reason,
                               "prompt_logprobs": per_prompt[index // body.n] if per_prompt else None}
        if body.logprobs is not None:
            tops = [t[:body.logprobs] for t in made[index].tops[:len(c.ids)]]
            row["logprobs"] = completion_logprobs(host.tokenizer, c.ids, c.logprobs, shape.as_ids, tops=tops)
        if body.return_token_ids:
            row["prompt_token_ids"] = prompts[index // body.n]
            row["token_ids"] = c.ids
        rows.append(row)
    return {"id": _id(body, "text_completion"), "object": "text_completion", "created": int(time.time()),
            "model": model, "choices": rows,
            "usage": usage(sum(map(len, prompts)) * body.n, sum(len(c.ids) for c in choices)),
            "rlvr_policy_version": version}


def _one_version(results: list[tuple[Any, int | None]]) -> int | None:
    versions = {v for _, v in results}
    return versions.pop() if len(versions) == 1 else None


def _with_tool_calls(choice: Choice) -> Choice:
    choice.content, choice.tool_calls = parse_tool_calls(choice.text)
    if choice.tool_calls:
        choice.finish_reason = "tool_calls"
    return choice


async def chat(host: ModelHost, body: ChatBody) -> dict[str, Any] | StreamingResponse:
    if body.top_logprobs and not body.logprobs:
        raise RequestError("top_logprobs needs logprobs = true (as the OpenAI API and vLLM have it)", "top_logprobs")
    adapter = host.resolve(body.model)
    prompt, parse_tools = await render(host.renderer, host.tokenizer, body)
    prompt = truncate(prompt, body, host.max_len)
    jobs = jobs_of(host, [prompt], body, body.max_completion_tokens or body.max_tokens)
    top_n = body.top_logprobs or 0
    model = body.model or host.name
    shape = Shape(top_n if body.logprobs else None, bool(body.return_tokens_as_token_ids), body.return_token_ids)
    if body.stream:
        deltas = _live(host, body, adapter, jobs, top_n, buffered=parse_tools)
        stream = _stream(body, "chat.completion", model, host.current_version, len(prompt))
        return StreamingResponse(sse(chat_stream(stream, host.tokenizer, deltas, len(jobs), prompt=prompt, shape=shape,
                                                 tool_calls=_with_tool_calls if parse_tools else None)),
                                 media_type="text/event-stream")
    made = host.submit(adapter, jobs, top_n=top_n)
    results = await host.wait(made)
    choices = _choices(host, body, [c for c, _ in results])
    rows = []
    for index, c in enumerate(choices):
        c.content = c.text
        if parse_tools:
            _with_tool_calls(c)
        message: dict[str, Any] = {"role": "assistant", "content": c.content}
        if c.tool_calls:
            message["tool_calls"] = c.tool_calls
        row: dict[str, Any] = {"index": index, "message": message, "logprobs": None,
                               "finish_reason": c.finish_reason, "stop_reason": c.stop_reason}
        if body.logprobs:
            row["logprobs"] = chat_logprobs(host.tokenizer, c.ids, c.logprobs, top=top_n, as_ids=shape.as_ids,
                                            tops=made[index].tops[:len(c.ids)])
        if body.return_token_ids:
            row["token_ids"] = c.ids
        rows.append(row)
    response = {"id": _id(body, "chat.completion"), "object": "chat.completion", "created": int(time.time()),
                "model": model, "choices": rows, "usage": usage(len(prompt), sum(len(c.ids) for c in choices)),
                "rlvr_policy_version": _one_version(results)}
    if body.return_token_ids:
        response["prompt_token_ids"] = prompt
    return response
