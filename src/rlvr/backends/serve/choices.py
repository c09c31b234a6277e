"""One sampled completion as ``rlvr serve`` answers it: decoded, cut at stop strings, and its
log-probs in the completions and chat shapes (shared by whole responses and streamed chunks).

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


def completion_logprobs(tokenizer: Any, ids: list[int], logprobs: list[float], as_ids: bool,
                        offset: int = 0) -> dict[str, Any]:
    """The completions shape for ``ids``; ``offset``: characters of the text before them."""
    tokens = token_strings(tokenizer, ids, as_ids)
    offsets, at = [], offset
    for token in tokens:
        offsets.append(at)
        at += len(token)
    return {"text_offset": offsets, "token_logprobs": logprobs, "tokens": tokens,
            "top_logprobs": [{tok: lp} for tok, lp in zip(tokens, logprobs, strict=True)]}


def chat_logprobs(tokenizer: Any, ids: list[int], logprobs: list[float], *, top: bool, as_ids: bool
                  ) -> dict[str, Any]:
    """The chat shape: one entry per token, ``top_logprobs`` holding the sampled token when asked."""
    content = []
    for token, lp in zip(token_strings(tokenizer, ids, as_ids), logprobs, strict=True):
        entry = {"token": token, "logprob": lp, "bytes": list(token.encode())}
        content.append({**entry, "top_logprobs": [entry] if top else []})
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
