"""``/v1/completions`` and ``/v1/chat/completions``: a parsed request to jobs for the host, and its
samples to a response, whole or streamed (:mod:`rlvr.backends.serve.streaming`).

Invariants: a streamed answer and a whole one are built from the same choices, so at the same
seed they carry the same text, tokens and log-probs; every refusal happens before the first byte
of an answer (a stream never starts and then fails on the request's fields).

A backend module: imports fastapi.
"""

from __future__ import annotations

import time
import uuid
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
from rlvr.backends.serve.streaming import Stream, chat_chunks, completion_chunks, sse
from rlvr.errors import RequestError


def _choices(host: ModelHost, outs: list[Any], body: CompletionBody | ChatBody) -> list[Choice]:
    stop_ids = tuple(body.stop_token_ids or ())
    return [finish(host.tokenizer, out, stops_of(body), skip_special_tokens=body.skip_special_tokens,
                   include_stop_str=body.include_stop_str_in_output, stop_token_ids=stop_ids) for out in outs]


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


def _prompts_of(host: ModelHost, body: CompletionBody) -> list[list[int]]:
    prompt = body.prompt
    if isinstance(prompt, str):
        prompt = [prompt]
    if prompt and isinstance(prompt[0], int):
        prompt = [list(prompt)]
    if not prompt:
        raise RequestError("prompt is empty", "prompt")
    ids = [list(host.tokenizer(p, add_special_tokens=body.add_special_tokens)["input_ids"]) if isinstance(p, str)
           else list(p) for p in prompt]
    return [truncate(p, body, host.max_len) for p in ids]


async def complete(host: ModelHost, body: CompletionBody) -> dict[str, Any] | StreamingResponse:
    if body.logprobs is not None and body.logprobs > 1:
        raise RequestError("logprobs > 1 is not supported by rlvr serve (only the sampled token's)", "logprobs")
    if body.prompt_logprobs not in (None, 0):
        raise RequestError(f"prompt_logprobs={body.prompt_logprobs} is not supported by rlvr serve: only 0 (each "
                           "prompt token's own log-prob) or leaving it out", "prompt_logprobs")
    if body.stream and body.prompt_logprobs is not None:
        raise RequestError("prompt_logprobs is not available with stream=true", "prompt_logprobs")
    adapter = host.resolve(body.model)
    prompts = _prompts_of(host, body)
    jobs = jobs_of(host, prompts, body, body.max_tokens or COMPLETION_MAX_TOKENS)
    scored = prompts if body.prompt_logprobs is not None else []
    outs, scores, version = await host.generate_scored(adapter, jobs, scored)
    choices = _choices(host, outs, body)
    model = body.model or host.name
    as_ids = bool(body.return_tokens_as_token_ids)
    if body.stream:
        stream = _stream(body, "text_completion", model, version, sum(map(len, prompts)) * body.n)
        return StreamingResponse(sse(completion_chunks(
            stream, host.tokenizer, choices, prompts=prompts, n=body.n, logprobs=body.logprobs is not None,
            as_ids=as_ids, token_ids=body.return_token_ids, skip_special_tokens=body.skip_special_tokens)),
            media_type="text/event-stream")
    per_prompt = [prompt_logprobs(host.tokenizer, p, s) for p, s in zip(scored, scores, strict=True)]
    rows = []
    for index, c in enumerate(choices):
        row: dict[str, Any] = {"index": index, "text": c.text, "logprobs": None, "finish_reason": c.finish_reason,
                               "stop_reason": c.stop_reason,
                               "prompt_logprobs": per_prompt[index // body.n] if per_prompt else None}
        if body.logprobs is not None:
            row["logprobs"] = completion_logprobs(host.tokenizer, c.ids, c.logprobs, as_ids)
        if body.return_token_ids:
            row["prompt_token_ids"] = prompts[index // body.n]
            row["token_ids"] = c.ids
        rows.append(row)
    return {"id": _id(body, "text_completion"), "object": "text_completion", "created": int(time.time()),
            "model": model, "choices": rows,
            "usage": usage(sum(map(len, prompts)) * body.n, sum(len(c.ids) for c in choices)),
            "rlvr_policy_version": version}


async def chat(host: ModelHost, body: ChatBody) -> dict[str, Any] | StreamingResponse:
    if body.top_logprobs and body.top_logprobs > 1:
        raise RequestError("top_logprobs > 1 is not supported by rlvr serve (only the sampled token's)", "top_logprobs")
    if body.top_logprobs and not body.logprobs:
        raise RequestError("top_logprobs needs logprobs = true (as the OpenAI API and vLLM have it)", "top_logprobs")
    adapter = host.resolve(body.model)
    prompt, parse_tools = render(host.tokenizer, body)
    prompt = truncate(prompt, body, host.max_len)
    jobs = jobs_of(host, [prompt], body, body.max_completion_tokens or body.max_tokens)
    outs, version = await host.generate(adapter, jobs)
    choices = _choices(host, outs, body)
    for c in choices:
        c.content = c.text
        if parse_tools:
            c.content, c.tool_calls = parse_tool_calls(c.text)
            if c.tool_calls:
                c.finish_reason = "tool_calls"
    model = body.model or host.name
    as_ids = bool(body.return_tokens_as_token_ids)
    if body.stream:
        return StreamingResponse(sse(chat_chunks(
            _stream(body, "chat.completion", model, version, len(prompt)), host.tokenizer, choices, prompt=prompt,
            logprobs=bool(body.logprobs), top=bool(body.top_logprobs), as_ids=as_ids, token_ids=body.return_token_ids,
            skip_special_tokens=body.skip_special_tokens)), media_type="text/event-stream")
    rows = []
    for index, c in enumerate(choices):
        message: dict[str, Any] = {"role": "assistant", "content": c.content}
        if c.tool_calls:
            message["tool_calls"] = c.tool_calls
        row: dict[str, Any] = {"index": index, "message": message, "logprobs": None,
                               "finish_reason": c.finish_reason, "stop_reason": c.stop_reason}
        if body.logprobs:
            row["logprobs"] = chat_logprobs(host.tokenizer, c.ids, c.logprobs, top=bool(body.top_logprobs),
                                            as_ids=as_ids)
        if body.return_token_ids:
            row["token_ids"] = c.ids
        rows.append(row)
    response = {"id": _id(body, "chat.completion"), "object": "chat.completion", "created": int(time.time()),
                "model": model, "choices": rows, "usage": usage(len(prompt), sum(len(c.ids) for c in choices)),
                "rlvr_policy_version": version}
    if body.return_token_ids:
        response["prompt_token_ids"] = prompt
    return response
