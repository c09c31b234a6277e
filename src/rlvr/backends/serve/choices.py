"""One sampled completion as ``rlvr serve`` answers it: decoded, cut at stop strings, and its
log-probs (and the most likely tokens', up to 20) in the completions and chat shapes (shared by
whole responses and streamed chunks).

Invariants: a choice's ``ids`` and ``logprobs`` end where its ``text`` ends (the token that completes
a stop string is kept, as vLLM keeps it); ``stop_reason`` is the stop string or stop token id that
ended it, ``None`` for eos or length.

A backend module: works on the tokenizer it is handed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from rlvr.types import Completion


@dataclass(slots=True)
class Choice:
    ids: list[int]
    logprobs: list[float]
    text: str
    finish_reason: str
    stop_reason: str | int | None
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    content: str | None = None  # chat: the text outside tool calls (``text`` when there are none)


def finish(tokenizer: Any, out: Completion, stops: list[str], *, skip_special_tokens: bool,
           include_stop_str: bool, stop_token_ids: tuple[int, ...] = ()) -> Choice:
    """Decode a completion and cut it at the first stop string (the token that completes it kept)."""
    def decode(ids: list[int]) -> str:
        return tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)

    ids, logprobs = list(out.ids), list(out.logprobs)
    text = decode(ids)
    if stops and any(s in text for s in stops):
        for end in range(1, len(ids) + 1):
            prefix = decode(ids[:end])
            hits = [(prefix.find(s), s) for s in stops if s in prefix]
            if hits:
                at, stop = min(hits)
                cut = prefix[:at] + (stop if include_stop_str else "")
                return Choice(ids[:end], logprobs[:end], cut, "stop", stop)
    if out.stop_reason == "stop":
        last = ids[-1] if ids else None
        return Choice(ids, logprobs, text, "stop", last if last in stop_token_ids else None)
    return Choice(ids, logprobs, text, "length", None)


def token_strings(tokenizer: Any, ids: list[int], as_ids: bool) -> list[str]:
    return [f"token_id:{t}" if as_ids else tokenizer.decode([t]) for t in ids]


Tops = list[list[tuple[int, float]]]  # per token, the (token id, log-prob) pairs most likely first


def completion_logprobs(tokenizer: Any, ids: list[int], logprobs: list[float], as_ids: bool,
                        offset: int = 0, tops: Tops | None = None) -> dict[str, Any]:
    """The completions shape for ``ids``; ``offset``: characters of the text before them. Each
    ``top_logprobs`` entry holds the sampled token and the ``logprobs`` most likely ones, as vLLM."""
    tokens = token_strings(tokenizer, ids, as_ids)
    offsets, at = [], offset
    for token in tokens:
        offsets.append(at)
        at += len(token)
    top_rows = []
    for k, (token, lp) in enumerate(zip(tokens, logprobs, strict=True)):
        row = {token: lp}
        for t, v in (tops[k] if tops else []):
            row.setdefault(token_strings(tokenizer, [t], as_ids)[0], v)
        top_rows.append(row)
    return {"text_offset": offsets, "token_logprobs": logprobs, "tokens": tokens, "top_logprobs": top_rows}


def chat_logprobs(tokenizer: Any, ids: list[int], logprobs: list[float], *, top: int, as_ids: bool,
                  tops: Tops | None = None) -> dict[str, Any]:
    """The chat shape: one entry per token, ``top_logprobs`` its ``top`` most likely tokens."""
    def entry(token: str, lp: float) -> dict[str, Any]:
        return {"token": token, "logprob": lp, "bytes": list(token.encode("utf-8", "replace"))}

    content = []
    for k, (token, lp) in enumerate(zip(token_strings(tokenizer, ids, as_ids), logprobs, strict=True)):
        pairs = (tops[k] if tops else [])[:top]
        content.append({**entry(token, lp),
                        "top_logprobs": [entry(token_strings(tokenizer, [t], as_ids)[0], v) for t, v in pairs]})
    return {"content": content}


def prompt_logprobs(tokenizer: Any, prompt: list[int], scored: tuple[list[float], list[int]]
                    ) -> list[dict[str, dict[str, Any]] | None]:
    """vLLM's per-prompt list: ``None`` for the first token (nothing before it), then one entry per
    token keyed by its id. vLLM decodes ``decoded_token`` even with ``return_tokens_as_token_ids``."""
    logprobs, ranks = scored
    entries = [{str(t): {"logprob": lp, "rank": rank, "decoded_token": tokenizer.decode([t])}}
               for t, lp, rank in zip(prompt[1:], logprobs, ranks, strict=True)]
    return [None, *entries]


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}
