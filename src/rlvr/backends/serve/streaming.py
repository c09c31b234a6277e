"""``stream=true`` answers: server-sent events in vLLM's and OpenAI's chunk shapes.

The engine samples a whole completion at once, so a stream is cut after generation, one chunk per
token (choices interleaved, each chunk naming its choice's ``index``); the first byte therefore
arrives when the batch is done, not at the first token. What a client assembles is exactly the
non-streamed answer: the chunks' text concatenates to the choice's text (a token whose text is not
yet whole, e.g. half of a multi-byte character, carries ``""`` and the next carries the rest),
their log-probs and ``token_ids`` are the choice's, the chunk of a choice's last token carries its
``finish_reason``. A chat choice with tool calls streams its content and its calls as one delta.
With ``stream_options.include_usage`` every chunk has ``usage: null`` and a last chunk with no
choices carries the request's usage (``continuous_usage_stats``: each chunk the usage so far).
The stream ends with ``data: [DONE]``.

A backend module: works on the tokenizer it is handed.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from rlvr.backends.serve.choices import Choice, chat_logprobs, completion_logprobs, usage


@dataclass(slots=True)
class Piece:
    text: str
    ids: list[int]
    logprobs: list[float]
    last: bool


def pieces(tokenizer: Any, choice: Choice, skip_special_tokens: bool) -> list[Piece]:
    """``choice`` cut into one piece per token whose texts concatenate to ``choice.text``."""
    ids, text = choice.ids, choice.text
    if not ids:
        return [Piece(text, [], [], True)]
    out, sent = [], 0
    for k in range(len(ids)):
        if k == len(ids) - 1:
            upto = len(text)
        else:
            prefix = tokenizer.decode(ids[:k + 1], skip_special_tokens=skip_special_tokens)
            common = len(os.path.commonprefix([prefix, text]))
            upto = sent if prefix.endswith("\ufffd") else max(sent, common)
        out.append(Piece(text[sent:upto], [ids[k]], [choice.logprobs[k]], k == len(ids) - 1))
        sent = upto
    return out


def _interleaved(per_choice: list[list[Piece]]) -> Iterator[tuple[int, Piece]]:
    for depth in range(max(map(len, per_choice), default=0)):
        for index, ps in enumerate(per_choice):
            if depth < len(ps):
                yield index, ps[depth]


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


def chat_chunks(stream: Stream, tokenizer: Any, choices: list[Choice], *, prompt: list[int], logprobs: bool,
                top: bool, as_ids: bool, token_ids: bool, skip_special_tokens: bool) -> Iterator[dict[str, Any]]:
    generated = 0
    for index in range(len(choices)):
        first = stream.chunk([{"index": index, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                               "finish_reason": None}], generated)
        if token_ids and index == 0:
            first["prompt_token_ids"] = prompt
        yield first
    per_choice = [[Piece(c.content or "", c.ids, c.logprobs, True)] if c.tool_calls
                  else pieces(tokenizer, c, skip_special_tokens) for c in choices]
    for index, piece in _interleaved(per_choice):
        choice = choices[index]
        delta: dict[str, Any] = {"content": piece.text}
        if choice.tool_calls:
            delta = {"content": choice.content,
                     "tool_calls": [{"index": k, **call} for k, call in enumerate(choice.tool_calls)]}
        generated += len(piece.ids)
        row: dict[str, Any] = {"index": index, "delta": delta, "logprobs": None,
                               "finish_reason": choice.finish_reason if piece.last else None}
        if piece.last:
            row["stop_reason"] = choice.stop_reason
        if logprobs:
            row["logprobs"] = chat_logprobs(tokenizer, piece.ids, piece.logprobs, top=top, as_ids=as_ids)
        if token_ids:
            row["token_ids"] = piece.ids
        yield stream.chunk([row], generated)
    yield from stream.closing(generated)


def completion_chunks(stream: Stream, tokenizer: Any, choices: list[Choice], *, prompts: list[list[int]], n: int,
                      logprobs: bool, as_ids: bool, token_ids: bool, skip_special_tokens: bool
                      ) -> Iterator[dict[str, Any]]:
    generated = 0
    offsets = [0] * len(choices)
    started = [False] * len(choices)
    per_choice = [pieces(tokenizer, c, skip_special_tokens) for c in choices]
    for index, piece in _interleaved(per_choice):
        choice = choices[index]
        generated += len(piece.ids)
        row: dict[str, Any] = {"index": index, "text": piece.text, "logprobs": None,
                               "finish_reason": choice.finish_reason if piece.last else None,
                               "stop_reason": choice.stop_reason if piece.last else None}
        if logprobs:
            row["logprobs"] = completion_logprobs(tokenizer, piece.ids, piece.logprobs, as_ids, offsets[index])
            offsets[index] += sum(map(len, row["logprobs"]["tokens"]))
        if token_ids:
            row["token_ids"] = piece.ids
            if not started[index]:
                row["prompt_token_ids"] = prompts[index // n]
        started[index] = True
        yield stream.chunk([row], generated)
    yield from stream.closing(generated)


def sse(chunks: Iterator[dict[str, Any]]) -> Iterator[str]:
    for chunk in chunks:
        yield f"data: {json.dumps(chunk)}\n\n"
    yield "data: [DONE]\n\n"
