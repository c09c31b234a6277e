"""The OpenAI shapes the proxy answers: ``/v1/chat/completions`` and ``/v1/completions``, whole or
streamed, each call sampled through its session's generator and recorded.

Requests are read with ``rlvr serve``'s request models (every field honoured or refused by name),
rendered with the run's tokenizer and chat template (the request's tools and template variables
over the run's), and answered in ``rlvr serve``'s (vLLM's) response and chunk shapes, built from the
very ids that are recorded: what the agent reads is exactly what the generator produced, cut at
the request's stop strings, with tool calls parsed back into the OpenAI shape where the model wrote
them in its family's form (:mod:`~rlvr.backends.serve.tool_calls`: the proxy's ``tool_parser``, by
default read from the chat template). A forced ``tool_choice`` (``"required"`` or a named function)
is honoured by prefilling the family's call opening after the rendered prompt: those tokens are
recorded as part of the call's prompt (never trained), and the answer is parsed from opening plus
completion. A choice's ``n`` samples are separate calls of the episode (separate branches for turn
matching).

A backend module: imports fastapi (through the server's shapes) and works on the tokenizer it is handed.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from fastapi.responses import StreamingResponse

from rlvr.backends.proxy.sessions import Attempt, Session, SessionBook, call_seed, generate, sampling_params, server_of
from rlvr.backends.serve.chat import forced_tool, render
from rlvr.backends.serve.choices import Choice, chat_logprobs, completion_logprobs, finish, usage
from rlvr.backends.serve.render import InlineRenderer
from rlvr.backends.serve.requests import ChatBody, CompletionBody, stops_of
from rlvr.backends.serve.streaming import (
    Shape,
    Stream,
    chat_stream,
    completion_stream,
    finished_deltas,
    sampled_tops,
    sse,
)
from rlvr.backends.serve.tool_calls import ToolParser, completion_text, parser_for
from rlvr.errors import RequestError
from rlvr.rollouts.turns import Call
from rlvr.seeding import derive_seed
from rlvr.types import Message, StopReason

COMPLETION_MAX_TOKENS = 16  # OpenAI's and vLLM's default for /v1/completions


@dataclass(frozen=True, slots=True)
class Model:
    """What the proxy renders and samples with: the tokenizer (its chat template), the run's template
    variables, the context length (``None``: unchecked), the per-call budget when a request names none,
    and what renders chat requests (``None``: a thread of this process, for a run's own agents; ``rlvr
    proxy`` gives a :class:`~rlvr.backends.serve.render.RenderPool`, bounded in time and memory)."""

    tokenizer: Any
    template_kwargs: Mapping[str, Any]
    max_len: int | None
    budget: int
    renderer: Any = None
    tool_parser: str = "auto"  # a family of rlvr.backends.serve.tool_calls, or read from the chat template

    def chat_renderer(self) -> Any:
        return self.renderer if self.renderer is not None else InlineRenderer(self.tokenizer)

    def parser(self, chat_template: str | None) -> ToolParser:
        template = chat_template or getattr(self.tokenizer, "chat_template", None)
        return parser_for(self.tool_parser, template if isinstance(template, str) else None)


@dataclass(frozen=True, slots=True)
class Rendered:
    """A chat request's prompt ids (a forced call's opening included), whether tool calls are parsed
    from its answers, in which family, and the opening prefilled (``""``: none)."""

    prompt: list[int]
    parse_tools: bool
    parser: ToolParser
    prefill: str = ""


async def render_chat(model: Model, body: ChatBody) -> Rendered:
    """``body`` rendered with the run's template variables under its own; a forced ``tool_choice``
    rendered as ``"auto"`` with its family's call opening prefilled."""
    forced, name = forced_tool(body)
    kwargs = {**model.template_kwargs, **(body.chat_template_kwargs or {})}
    update: dict[str, Any] = {"chat_template_kwargs": kwargs or None}
    if forced:
        update["tool_choice"] = "auto"
    prompt, parse_tools = await render(model.chat_renderer(), model.tokenizer, body.model_copy(update=update))
    parser = model.parser(body.chat_template)
    if not forced:
        return Rendered(prompt, parse_tools, parser)
    prefill = parser.prefill(name)
    opening = list(model.tokenizer(prefill, add_special_tokens=False)["input_ids"])
    return Rendered(prompt + opening, True, parser, prefill)


@dataclass(slots=True)
class Sampled:
    """One answered choice, as recorded."""

    choice: Choice
    call: Call


async def sample(book: SessionBook, session: Session, model: Model, prompt: list[int], body: Any,
                 max_tokens: int | None, messages: Sequence[Message] | None, parse_tools: bool, *,
                 attempt: Attempt | None = None, parser: ToolParser | None = None, prefill: str = ""
                 ) -> list[Sampled]:
    """``body.n`` choices for ``prompt``, each recorded as a call of ``session`` (unless ``attempt``,
    the request they answer, was superseded by a client's retry meanwhile)."""
    if body.bad_words:
        raise RequestError("bad_words is not supported by the rlvr proxy (the generator takes no token "
                           "sequences to forbid): leave it out", "bad_words")
    if model.max_len is not None and len(prompt) >= model.max_len:
        raise RequestError(f"the prompt is {len(prompt)} tokens; the model's context is {model.max_len}",
                           "messages" if messages is not None else "prompt")
    params = sampling_params(session, temperature=body.temperature, top_p=body.top_p, max_tokens=max_tokens,
                             stop_token_ids=body.stop_token_ids or (), budget=model.budget)
    if model.max_len is not None and len(prompt) + params.max_tokens > model.max_len:  # what is left of the context
        params = dataclasses.replace(params, max_tokens=model.max_len - len(prompt))
    if body.allowed_token_ids:
        params = dataclasses.replace(params, allowed_token_ids=tuple(body.allowed_token_ids))
    first = book.take_index(session, body.n)
    seeds = [call_seed(session, first + j, None if body.seed is None else derive_seed(body.seed, "choice", j))
             for j in range(body.n)]
    outs = await asyncio.gather(*(generate(session, prompt, params, seed) for seed in seeds))
    if session.closed:
        raise RequestError(f"proxy session {session.id!r} ended while this call sampled", None, 404)
    server, done = server_of(session), []
    for j, out in enumerate(outs):
        choice = finish(model.tokenizer, out, stops_of(body), skip_special_tokens=body.skip_special_tokens,
                        include_stop_str=body.include_stop_str_in_output,
                        stop_token_ids=tuple(body.stop_token_ids or ()))
        choice.content = choice.text
        if parse_tools:
            parser = parser or model.parser(None)
            choice.content, choice.tool_calls = parser.parse(
                prefill + completion_text(model.tokenizer, choice.ids, choice.text, parser))
            if choice.tool_calls:
                choice.finish_reason = "tool_calls"
            else:
                choice.content = prefill + choice.text
        reply: Message = {"role": "assistant", "content": choice.content}
        if choice.tool_calls:
            reply["tool_calls"] = choice.tool_calls
        call = Call(first + j, tuple(prompt), tuple(choice.ids), tuple(choice.logprobs),
                    messages=tuple(messages) if messages is not None else None, reply=reply, version=out.version,
                    stop_reason=StopReason.LENGTH if choice.finish_reason == "length" else StopReason.STOP,
                    server=server)
        done.append(Sampled(choice, call))
    book.keep(session, attempt, [s.call for s in done])
    return done


def _stream(body: Any, kind: str, version: int | None, prompt_tokens: int) -> Stream:
    options = body.stream_options
    prefix = "chatcmpl" if kind == "chat.completion" else "cmpl"
    return Stream(id=f"{prefix}-{body.request_id or uuid.uuid4().hex}",
                  object=f"{kind}.chunk" if kind == "chat.completion" else kind, created=int(time.time()),
                  model=body.model or "policy", version=version, prompt_tokens=prompt_tokens,
                  include_usage=bool(options and options.include_usage),
                  continuous_usage=bool(options and options.include_usage and options.continuous_usage_stats))


def _version(done: list[Sampled]) -> int | None:
    versions = [s.call.version for s in done if s.call.version is not None]
    return min(versions) if versions else None


async def chat(book: SessionBook, model: Model, body: ChatBody, sid: str | None, attempt: Attempt | None = None
               ) -> dict[str, Any] | StreamingResponse:
    if body.top_logprobs and body.top_logprobs > 1:
        raise RequestError("top_logprobs > 1 is not supported by the rlvr proxy (only the sampled token's)",
                           "top_logprobs")
    if body.top_logprobs and not body.logprobs:
        raise RequestError("top_logprobs needs logprobs = true (as the OpenAI API has it)", "top_logprobs")
    session = book.get(sid)
    if attempt is not None:
        book.begin(session, attempt)
    rendered = await render_chat(model, body)
    prompt = rendered.prompt
    done = await sample(book, session, model, prompt, body, body.max_completion_tokens or body.max_tokens,
                        body.messages, rendered.parse_tools, attempt=attempt, parser=rendered.parser,
                        prefill=rendered.prefill)
    choices, version = [s.choice for s in done], _version(done)
    tok = model.tokenizer
    as_ids = bool(body.return_tokens_as_token_ids)
    if body.stream:
        shape = Shape(logprobs=(body.top_logprobs or 0) if body.logprobs else None, as_ids=as_ids,
                      token_ids=bool(body.return_token_ids))
        deltas = finished_deltas(tok, choices, skip_special_tokens=body.skip_special_tokens, version=version)
        return StreamingResponse(sse(chat_stream(_stream(body, "chat.completion", version, len(prompt)), tok, deltas,
                                                 len(choices), prompt=prompt, shape=shape, tool_calls=None)),
                                 media_type="text/event-stream")
    rows = []
    for index, (c, s) in enumerate(zip(choices, done, strict=True)):
        row: dict[str, Any] = {"index": index, "message": dict(s.call.reply or {}), "logprobs": None,
                               "finish_reason": c.finish_reason, "stop_reason": c.stop_reason}
        if body.logprobs:
            row["logprobs"] = chat_logprobs(tok, c.ids, c.logprobs, top=body.top_logprobs or 0, as_ids=as_ids,
                                            tops=sampled_tops(c))
        if body.return_token_ids:
            row["token_ids"] = c.ids
        rows.append(row)
    answer = {"id": f"chatcmpl-{body.request_id or uuid.uuid4().hex}", "object": "chat.completion",
              "created": int(time.time()), "model": body.model or "policy", "choices": rows,
              "usage": usage(len(prompt), sum(len(c.ids) for c in choices)), "rlvr_policy_version": version,
              "rlvr_calls": [s.call.index for s in done]}
    if body.return_token_ids:
        answer["prompt_token_ids"] = prompt
    return answer


async def _prompts(model: Model, body: CompletionBody) -> list[list[int]]:
    prompt = body.prompts()
    if not prompt:
        raise RequestError("prompt is empty", "prompt")
    texts = [p for p in prompt if isinstance(p, str)]
    if texts and model.renderer is not None:  # rlvr proxy: tokenized in its render pool, bounded as renders are
        ids = iter(await model.renderer.texts(texts, add_special_tokens=body.add_special_tokens, field="prompt"))
        return [next(ids) if isinstance(p, str) else list(p) for p in prompt]
    return [list(model.tokenizer(p, add_special_tokens=body.add_special_tokens)["input_ids"]) if isinstance(p, str)
            else list(p) for p in prompt]


async def complete(book: SessionBook, model: Model, body: CompletionBody, sid: str | None,
                   attempt: Attempt | None = None) -> dict[str, Any] | StreamingResponse:
    if body.logprobs is not None and body.logprobs > 1:
        raise RequestError("logprobs > 1 is not supported by the rlvr proxy (only the sampled token's)", "logprobs")
    if body.prompt_logprobs is not None:
        raise RequestError("prompt_logprobs is not answered by the rlvr proxy: score through the run's sampler",
                           "prompt_logprobs")
    session = book.get(sid)
    if attempt is not None:
        book.begin(session, attempt)
    prompts = await _prompts(model, body)
    per_prompt = [await sample(book, session, model, p, body, body.max_tokens or COMPLETION_MAX_TOKENS, None, False,
                               attempt=attempt) for p in prompts]
    done = [s for group in per_prompt for s in group]
    choices, version, tok = [s.choice for s in done], _version(done), model.tokenizer
    as_ids = bool(body.return_tokens_as_token_ids)
    if body.stream:
        shape = Shape(logprobs=body.logprobs, as_ids=as_ids, token_ids=bool(body.return_token_ids))
        deltas = finished_deltas(tok, choices, skip_special_tokens=body.skip_special_tokens, version=version)
        return StreamingResponse(sse(completion_stream(
            _stream(body, "text_completion", version, sum(map(len, prompts)) * body.n), tok, deltas,
            prompts=prompts, n=body.n, shape=shape)), media_type="text/event-stream")
    rows = []
    for index, c in enumerate(choices):
        row: dict[str, Any] = {"index": index, "text": c.text, "logprobs": None, "finish_reason": c.finish_reason,
                               "stop_reason": c.stop_reason}
        if body.logprobs is not None:
            row["logprobs"] = completion_logprobs(tok, c.ids, c.logprobs, as_ids)
        if body.return_token_ids:
            row["prompt_token_ids"] = prompts[index // body.n]
            row["token_ids"] = c.ids
        rows.append(row)
    return {"id": f"cmpl-{body.request_id or uuid.uuid4().hex}", "object": "text_completion",
            "created": int(time.time()), "model": body.model or "policy", "choices": rows,
            "usage": usage(sum(map(len, prompts)) * body.n, sum(len(c.ids) for c in choices)),
            "rlvr_policy_version": version, "rlvr_calls": [s.call.index for s in done]}
