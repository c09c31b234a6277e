"""``stream=true`` answers: server-sent events in vLLM's and OpenAI's chunk shapes, sent as tokens
are generated.

The scheduler calls a stream's listener in the event-loop turn each token of its choices arrives
(:mod:`~rlvr.backends.serve.scheduler`); :func:`live_chunks` turns each into one chunk naming its
choice's ``index``. What a client assembles is exactly the non-streamed answer: a chunk's text is
held back while it could still change (an incomplete multi-byte character, trailing whitespace a
following token may merge with, or the start of a stop string), and the chunk of a choice's last
token carries the rest of its text and its ``finish_reason`` (the text being
:func:`~rlvr.backends.serve.choices.finish`'s, as in a whole answer); the log-probs and
``token_ids`` are the choice's. A choice that meets a stop string is finished there and its row
stops generating. A chat choice whose tools are parsed streams its content and its calls as one
delta once it ends. With ``stream_options.include_usage`` every chunk has ``usage: null`` and a last
chunk with no choices carries the request's usage (``continuous_usage_stats``: each chunk the usage
so far). A failure after the first byte is one ``{"error": ...}`` event. The stream ends with
``data: [DONE]``; a client that goes away cancels its rows.

A backend module: works on the tokenizer it is handed.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from typing import Any

from rlvr.backends.serve.choices import Choice, usage
from rlvr.backends.serve.scheduler import Job
from rlvr.errors import RequestError
from rlvr.types import Completion, StopReason


@dataclass(slots=True)
class Stream:
    """What every chunk of one response shares."""

    id: str
    object: str
    created: int
    model: str
    version: int | None
    prompt_tokens: int
    include_usage: bool
    continuous_usage: bool

    def chunk(self, choices: list[dict[str, Any]], generated: int) -> dict[str, Any]:
        out = {"id": self.id, "object": self.object, "created": self.created, "model": self.model,
               "choices": choices, "rlvr_policy_version": self.version}
        if self.include_usage:
            out["usage"] = usage(self.prompt_tokens, generated) if self.continuous_usage else None
        return out

    def closing(self, generated: int) -> Iterator[dict[str, Any]]:
        if self.include_usage:
            yield {**self.chunk([], generated), "usage": usage(self.prompt_tokens, generated)}


@dataclass(slots=True)
class Delta:
    """One token's chunk of one choice: its text, token, and the finished choice on its last."""

    index: int
    text: str
    ids: list[int]
    logprobs: list[float]
    tops: list[list[tuple[int, float]]]
    final: Choice | None
    version: int | None


class LiveText:
    """One choice's text as its tokens arrive: what may be sent now, and the choice once it ends."""

    def __init__(self, tokenizer: Any, finish: Callable[[Completion], Choice], stops: list[str],
                 skip_special_tokens: bool, buffered: bool):
        self.tokenizer, self.finish, self.stops = tokenizer, finish, stops
        self.skip, self.buffered = skip_special_tokens, buffered
        self.hold = max(map(len, stops), default=1) - 1  # a stop string's start may not go out
        self.sent = ""
        self.done = False

    def step(self, job: Job, upto: int, reason: str | None) -> tuple[str, Choice | None]:
        ids = job.ids[:upto]
        text = self.tokenizer.decode(ids, skip_special_tokens=self.skip)
        if reason is None and self.stops and any(s in text for s in self.stops):
            reason = "stop"  # finish() cuts at the stop string: the same choice a whole answer gets
        if reason is not None:
            choice = self.finish(Completion(tuple(ids), tuple(job.logprobs[:upto]), StopReason(reason)))
            self.done = True
            rest = choice.text[len(self.sent):] if choice.text.startswith(self.sent) else ""
            return rest, choice
        if self.buffered or text.endswith("\ufffd") or not text.startswith(self.sent):
            return "", None
        safe = len(text.rstrip()) if text.rstrip() != text else len(text)
        safe = max(len(self.sent), min(safe, len(text) - self.hold))
        piece = text[len(self.sent):safe]
        self.sent += piece
        return piece, None


async def live_deltas(jobs: list[Job], events: asyncio.Queue, texts: list[LiveText]) -> AsyncIterator[Delta]:
    """Each token of ``jobs`` as it arrives (``events`` is fed by their listener), until every choice ends."""
    index = {id(job): k for k, job in enumerate(jobs)}
    try:
        while not all(t.done for t in texts):
            job, upto, reason = await events.get()
            k = index[id(job)]
            if texts[k].done:
                continue
            if job.future.done() and not job.future.cancelled() and job.future.exception() is not None:
                raise job.future.exception()  # type: ignore[misc]
            if upto == 0:
                continue
            piece, final = texts[k].step(job, upto, reason)
            if final is not None:
                job.cancelled = True  # a stop string may end it before its row does
                count = len(final.ids)
                yield Delta(k, piece, job.ids[upto - 1:count], job.logprobs[upto - 1:count], job.tops[upto - 1:count],
                            final, job.version)
            else:
                yield Delta(k, piece, [job.ids[upto - 1]], [job.logprobs[upto - 1]], job.tops[upto - 1:upto], None,
                            job.version)
    finally:
        for job in jobs:
            job.cancelled = True


def _pieces(tokenizer: Any, choice: Choice, skip_special_tokens: bool) -> list[tuple[str, int]]:
    """``choice`` cut into one (text, token) piece per token whose texts concatenate to ``choice.text``.

    Each token's text is found by decoding a window of the last few tokens (the incremental
    detokenizing vLLM and ``transformers``' streamers do), so a long completion costs linear time, not
    a decode of every prefix. A piece is taken only where it continues ``choice.text``; where the
    window disagrees (a tokenizer whose text depends on more context) the whole prefix is decoded and
    aligned for that token; a token ending in an incomplete character sends nothing until it is
    complete; the last token takes the rest."""
    ids, text, out, sent = choice.ids, choice.text, [], 0
    start, read = 0, 0  # the window decodes ids[start:...]; ids[start:read] is already sent
    for k in range(len(ids)):
        if k == len(ids) - 1:
            upto = len(text)
        else:
            before = tokenizer.decode(ids[start:read], skip_special_tokens=skip_special_tokens)
            after = tokenizer.decode(ids[start:k + 1], skip_special_tokens=skip_special_tokens)
            piece = after[len(before):]
            if after.endswith("\ufffd") or not after.startswith(before):
                upto = sent
            elif text.startswith(piece, sent):
                upto = sent + len(piece)
                start, read = read, k + 1
            else:
                prefix = tokenizer.decode(ids[:k + 1], skip_special_tokens=skip_special_tokens)
                upto = sent if prefix.endswith("\ufffd") else max(sent, _common_length(prefix, text))
                start, read = k, k + 1  # token k stays as context (a SentencePiece word's leading space)
        out.append((text[sent:upto], k))
        sent = upto
    return out


def _common_length(a: str, b: str) -> int:
    """The length of the longest common prefix of ``a`` and ``b`` in O(log n) C-level comparisons
    (``a[:k]`` being a prefix of ``b`` is monotone in ``k``)."""
    if b.startswith(a):
        return len(a)
    lo, hi = 0, min(len(a), len(b))  # a[:lo] is a prefix of b; a[:hi + 1] is not
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if b.startswith(a[:mid]):
            lo = mid
        else:
            hi = mid - 1
    return lo


def sampled_tops(choice: Choice) -> list[list[tuple[int, float]]]:
    """Each token's top log-probs where only the sampled token's is known (a finished choice)."""
    return [[(t, lp)] for t, lp in zip(choice.ids, choice.logprobs, strict=True)]


async def finished_deltas(tokenizer: Any, choices: list[Choice], *, skip_special_tokens: bool,
                          version: int | None) -> AsyncIterator[Delta]:
    """Choices sampled whole (the recording proxy's) as the deltas of a live stream: one per token,
    the choices interleaved, each choice's texts concatenating to its text; a choice with tool calls
    is one delta."""
    def cut(index: int, choice: Choice) -> list[Delta]:
        tops = sampled_tops(choice)

        def delta(text: str, lo: int, hi: int) -> Delta:
            return Delta(index, text, list(choice.ids[lo:hi]), list(choice.logprobs[lo:hi]), tops[lo:hi],
                         choice if hi == len(choice.ids) else None, version)

        if choice.tool_calls or not choice.ids:
            return [delta((choice.content or "") if choice.tool_calls else choice.text, 0, len(choice.ids))]
        return [delta(text, k, k + 1) for text, k in _pieces(tokenizer, choice, skip_special_tokens)]

    per_choice = [cut(i, c) for i, c in enumerate(choices)]
    for depth in range(max(map(len, per_choice), default=0)):
        for deltas in per_choice:
            if depth < len(deltas):
                yield deltas[depth]


def listener_for(events: asyncio.Queue) -> Callable[[Job, str | None], None]:
    def heard(job: Job, reason: str | None) -> None:
        events.put_nowait((job, len(job.ids), reason))
    return heard


def error_event(exc: BaseException) -> dict[str, Any]:
    if isinstance(exc, RequestError):
        return {"error": {"message": exc.message, "type": "BadRequestError", "param": exc.param, "code": exc.status}}
    return {"error": {"message": f"{type(exc).__name__}: {exc}", "type": "InternalServerError", "param": None,
                      "code": 500}}


async def sse(chunks: AsyncIterator[dict[str, Any]]) -> AsyncIterator[str]:
    try:
        async for chunk in chunks:
            yield f"data: {json.dumps(chunk)}\n\n"
    except Exception as exc:  # noqa: BLE001 - the status line is sent: the failure is an event
        yield f"data: {json.dumps(error_event(exc))}\n\n"
    yield "data: [DONE]\n\n"


@dataclass(slots=True)
class Shape:
    """What a request asks its chunks to carry."""

    logprobs: int | None  # None: no log-probs; else how many top ones
    as_ids: bool
    token_ids: bool


async def chat_stream(stream: Stream, tokenizer: Any, deltas: AsyncIterator[Delta], choices: int, *,
                      prompt: list[int], shape: Shape, tool_calls: Callable[[Choice], Choice] | None
                      ) -> AsyncIterator[dict[str, Any]]:
    from rlvr.backends.serve.choices import chat_logprobs

    generated = 0
    for index in range(choices):
        first = stream.chunk([{"index": index, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                               "finish_reason": None}], generated)
        if shape.token_ids and index == 0:
            first["prompt_token_ids"] = prompt
        yield first
    async for d in deltas:
        generated += len(d.ids)
        stream.version = d.version
        delta: dict[str, Any] = {"content": d.text}
        row: dict[str, Any] = {"index": d.index, "delta": delta, "logprobs": None, "finish_reason": None}
        if d.final is not None:
            final = tool_calls(d.final) if tool_calls else d.final
            if final.tool_calls:
                row["delta"] = {"content": final.content,
                                "tool_calls": [{"index": k, **call} for k, call in enumerate(final.tool_calls)]}
            row["finish_reason"], row["stop_reason"] = final.finish_reason, final.stop_reason
        if shape.logprobs is not None:
            row["logprobs"] = chat_logprobs(tokenizer, d.ids, d.logprobs, top=shape.logprobs, as_ids=shape.as_ids,
                                            tops=d.tops)
        if shape.token_ids:
            row["token_ids"] = d.ids
        yield stream.chunk([row], generated)
    for chunk in stream.closing(generated):
        yield chunk


async def completion_stream(stream: Stream, tokenizer: Any, deltas: AsyncIterator[Delta], *, prompts: list[list[int]],
                            n: int, shape: Shape) -> AsyncIterator[dict[str, Any]]:
    from rlvr.backends.serve.choices import completion_logprobs

    generated = 0
    offsets = [0] * (len(prompts) * n)
    started = [False] * len(offsets)
    async for d in deltas:
        generated += len(d.ids)
        stream.version = d.version
        final = d.final
        row: dict[str, Any] = {"index": d.index, "text": d.text, "logprobs": None,
                               "finish_reason": final.finish_reason if final else None,
                               "stop_reason": final.stop_reason if final else None}
        if shape.logprobs is not None:
            row["logprobs"] = completion_logprobs(tokenizer, d.ids, d.logprobs, shape.as_ids, offsets[d.index],
                                                  tops=[t[:shape.logprobs] for t in d.tops])
            offsets[d.index] += sum(map(len, row["logprobs"]["tokens"]))
        if shape.token_ids:
            row["token_ids"] = d.ids
            if not started[d.index]:
                row["prompt_token_ids"] = prompts[d.index // n]
        started[d.index] = True
        yield stream.chunk([row], generated)
    for chunk in stream.closing(generated):
        yield chunk
