"""The request bodies ``rlvr serve`` accepts, and what turns one into sampling jobs.

Invariant: every field of a request is either honoured or refused with a 400 that names it. The
bodies declare the honoured fields; any other field is looked up in :data:`NEUTRAL` (a value that
changes nothing is accepted, as if left out; any other value is refused) or :data:`UNSUPPORTED`
(refused unless ``null``), and a field in neither is refused as unknown (vLLM only logs those; a
client that believes a knob was applied would be misled). Defaults follow vLLM: a completion
without ``max_tokens`` gets 16 tokens, a chat completion the rest of the context.

A backend module: imports pydantic and the tokenizer it is handed.
"""

from __future__ import annotations

import dataclasses
import secrets
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, ValidationError

from rlvr.errors import RequestError
from rlvr.seeding import derive_seed
from rlvr.types import SamplingParams

MAX_N = 256
MAX_TOP_LOGPROBS = 20  # vLLM's default --max-logprobs
MAX_NAME = 1024  # model and adapter names, ids; paths get MAX_PATH
MAX_PATH = 4096
GREEDY_BELOW = 1e-5  # a temperature under this samples greedily, as vLLM does
COMPLETION_MAX_TOKENS = 16  # vLLM's default for /v1/completions

# Fields accepted only at values that change nothing (vLLM's defaults): anything else is refused.
NEUTRAL: dict[str, tuple[Any, ...]] = {
    "presence_penalty": (0, 0.0), "frequency_penalty": (0, 0.0), "logit_bias": ({},), "ignore_eos": (False,),
    "use_beam_search": (False,),
    "min_tokens": (0,), "length_penalty": (1, 1.0), "spaces_between_special_tokens": (True,), "priority": (0,),
    "echo": (False,), "suffix": ("",), "parallel_tool_calls": (True,), "include_reasoning": (True,),
    "store": (False,), "response_format": ({"type": "text"},), "logits_processors": ([],), "documents": ([],),
}
# Fields rlvr serve does not implement: refused unless null. The value is what to do instead.
UNSUPPORTED: dict[str, str] = {
    "response_format": "structured output is not implemented; validate the text yourself",
    "guided_json": "guided decoding is not implemented", "guided_regex": "guided decoding is not implemented",
    "guided_choice": "guided decoding is not implemented", "guided_grammar": "guided decoding is not implemented",
    "guided_decoding_backend": "guided decoding is not implemented",
    "guided_whitespace_pattern": "guided decoding is not implemented",
    "structural_tag": "guided decoding is not implemented", "structured_outputs": "guided decoding is not implemented",
    "logits_processors": "custom logits processors are not loaded by rlvr serve",
    "prompt_embeds": "send token ids or text", "mm_processor_kwargs": "rlvr serve is text only",
    "audio": "rlvr serve is text only", "modalities": "rlvr serve is text only",
    "functions": "use tools", "function_call": "use tool_choice", "prediction": "predicted outputs are not implemented",
    "web_search_options": "rlvr serve has no web search", "reasoning_effort": "pass it in chat_template_kwargs "
    "if the model's template reads it", "metadata": "rlvr serve stores nothing", "store": "rlvr serve stores nothing",
    "service_tier": "rlvr serve has one tier", "verbosity": "not implemented",
    "cache_salt": "rlvr serve has no prefix cache", "kv_transfer_params": "rlvr serve has no KV transfer",
    "vllm_xargs": "no extensions read them", "documents": "not implemented",
}


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    include_usage: StrictBool | None = True  # vLLM: asking for stream_options means usage by default
    continuous_usage_stats: StrictBool | None = False


class _Sampling(BaseModel):
    model_config = ConfigDict(extra="allow")  # audited by refuse_unhonoured: nothing is dropped silently

    model: str | None = Field(None, max_length=MAX_NAME)
    n: int = Field(1, ge=1, le=MAX_N)
    max_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0.0, allow_inf_nan=False)
    top_p: float | None = Field(None, gt=0.0, le=1.0, allow_inf_nan=False)
    top_k: StrictInt | None = Field(None, ge=-1)  # 0 or -1: off, as vLLM
    min_p: float | None = Field(None, ge=0.0, le=1.0, allow_inf_nan=False)
    repetition_penalty: float | None = Field(None, gt=0.0, allow_inf_nan=False)
    seed: int | None = None
    stop: str | list[str] | None = Field(None, max_length=64)
    stop_token_ids: list[StrictInt] | None = Field(None, max_length=1024)
    allowed_token_ids: list[StrictInt] | None = Field(None, min_length=1)
    bad_words: list[str] | None = Field(None, max_length=256)
    truncate_prompt_tokens: int | None = Field(None, ge=-1)
    return_token_ids: bool = False
    return_tokens_as_token_ids: bool | None = False
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    stream: StrictBool | None = False
    stream_options: StreamOptions | None = None
    best_of: int | None = None
    user: str | None = Field(None, max_length=MAX_NAME)  # an end user's id, for the caller's records: not applied
    request_id: str | None = Field(None, max_length=256)


class CompletionBody(_Sampling):
    prompt: str | list[StrictInt] | list[str] | list[list[StrictInt]]
    logprobs: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)
    prompt_logprobs: int | None = None
    add_special_tokens: bool = True

    def prompts(self) -> list[str | list[int]]:
        """The prompt as a list of prompts, each a text or token ids (OpenAI's four shapes made one)."""
        if isinstance(self.prompt, str):
            return [self.prompt]
        items: list[Any] = list(self.prompt)  # one of the validated shapes: its first item says which
        if items and isinstance(items[0], int):
            return [items]
        return [p if isinstance(p, str) else list(p) for p in items]


class ChatBody(_Sampling):
    messages: list[dict[str, Any]] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool | None = False
    top_logprobs: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    add_special_tokens: bool = False
    chat_template: str | None = None  # bounded by the render pool (rlvr serve --max-template-chars)
    chat_template_kwargs: dict[str, Any] | None = None


def check_strings(data: Any, where: str = "") -> None:
    """A 400 naming the field of the first string (or object key) in ``data`` holding a NUL byte or
    a lone surrogate (JSON's ``\\ud800`` escapes decode to one; no tokenizer, path or JSON encoder
    takes it). Walks without recursion: nesting depth is bounded by the JSON parser only."""
    stack = [(data, where)]
    while stack:
        value, at = stack.pop()
        if isinstance(value, str):
            _check_string(value, at)
        elif isinstance(value, dict):
            for key, item in value.items():
                _check_string(key, f"{at}.{key!s:.40}" if at else str(key)[:40])
                stack.append((item, f"{at}.{key}" if at else key))
        elif isinstance(value, list):
            stack += [(item, f"{at}[{k}]") for k, item in enumerate(value)]


def _check_string(text: str, at: str) -> None:
    field = at.split(".")[0].split("[")[0] or None
    if "\0" in text:
        raise RequestError(f"{_printable(at)} contains a NUL byte", field)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise RequestError(f"{_printable(at)} is not valid Unicode (a lone surrogate)", field) from None


def _printable(at: str) -> str:
    return at.encode("utf-8", "backslashreplace").decode("utf-8").replace("\0", "\\0")[:200] or "body"


def parse(model: type[BaseModel], body: Any) -> Any:
    """``body`` validated into ``model``; the first problem a 400 naming its field."""
    try:
        parsed = model.model_validate(body)
    except ValidationError as exc:
        err = exc.errors()[0]
        field = str(err["loc"][0]) if err["loc"] else None
        where = ".".join(str(part) for part in err["loc"]) or "body"
        raise RequestError(f"{where}: {err['msg']}", field) from None
    if isinstance(parsed, _Sampling):
        refuse_unhonoured(parsed)
    return parsed


def refuse_unhonoured(body: _Sampling) -> None:
    """A 400 naming the first field this server would otherwise ignore."""
    for field, value in (body.model_extra or {}).items():
        if value is None or value in NEUTRAL.get(field, ()):
            continue
        if field in NEUTRAL or field in UNSUPPORTED:
            hint = UNSUPPORTED.get(field)
            neutral = NEUTRAL.get(field)
            allowed = f" (only {neutral[0]!r} or leaving it out)" if neutral else ""
            raise RequestError(f"{field}={value!r} is not supported by rlvr serve{allowed}"
                               + (f": {hint}" if hint else ""), field)
        raise RequestError(f"{field} is not a request field rlvr serve knows (it speaks OpenAI's and vLLM's "
                           "field names); remove it rather than have it ignored", field)
    stops = [body.stop] if isinstance(body.stop, str) else list(body.stop or [])
    if any(not s for s in stops):
        raise RequestError("stop strings must be non-empty", "stop")
    if body.best_of not in (None, body.n):
        raise RequestError("best_of must equal n (or be left out)", "best_of")
    if body.stream_options is not None and not body.stream:
        raise RequestError("stream_options is only read with stream=true", "stream_options")


def stops_of(body: _Sampling) -> list[str]:
    return [body.stop] if isinstance(body.stop, str) else list(body.stop or [])


def truncate(prompt: list[int], body: _Sampling, max_len: int) -> list[int]:
    """The prompt's last ``truncate_prompt_tokens`` tokens (``-1``: the context length), as vLLM."""
    keep = body.truncate_prompt_tokens
    if keep is None:
        return prompt
    if keep == 0:
        raise RequestError("truncate_prompt_tokens must be -1 or at least 1", "truncate_prompt_tokens")
    keep = max_len if keep == -1 else keep
    return prompt[-keep:]


def _token_ids(ids: list[int] | None, field: str, vocab: int) -> tuple[int, ...]:
    if ids and any(t < 0 or t >= vocab for t in ids):
        raise RequestError(f"{field} has token ids outside [0, {vocab})", field)
    return tuple(ids or ())


def bad_words_ids(tokenizer: Any, words: list[str]) -> tuple[tuple[int, ...], ...]:
    """Each bad word as token ids, alone and after a space (its two usual spellings mid-text), as vLLM."""
    out: list[tuple[int, ...]] = []
    for word in words:
        if not word.strip():
            raise RequestError("bad_words entries must be non-empty", "bad_words")
        for spelling in (word, " " + word.lstrip()):
            ids = tuple(tokenizer(spelling, add_special_tokens=False)["input_ids"])
            if ids and ids not in out:
                out.append(ids)
    return tuple(out)


def jobs_of(host: Any, prompts: list[list[int]], body: _Sampling, max_tokens: int | None
            ) -> list[tuple[list[int], SamplingParams, int]]:
    """One ``(prompt, params, seed)`` per sample: ``n`` per prompt, seeds derived from the request's.
    ``max_tokens`` ``None``: each prompt's rest of the context."""
    if len(prompts) * body.n > host.policy.max_samples:
        raise RequestError(f"{len(prompts)} prompts x n={body.n} = {len(prompts) * body.n} samples; this server takes "
                           f"at most {host.policy.max_samples} per request (split it)", "n")
    temperature = 1.0 if body.temperature is None else body.temperature
    base = SamplingParams(
        max_tokens=1, temperature=0.0 if temperature < GREEDY_BELOW else temperature,
        top_p=1.0 if body.top_p is None else body.top_p, top_k=body.top_k or 0,
        min_p=0.0 if body.min_p is None else body.min_p,
        repetition_penalty=1.0 if body.repetition_penalty is None else body.repetition_penalty,
        stop_token_ids=_token_ids(body.stop_token_ids, "stop_token_ids", host.vocab_size),
        allowed_token_ids=_token_ids(body.allowed_token_ids, "allowed_token_ids", host.vocab_size) or None,
        bad_words_ids=bad_words_ids(host.tokenizer, body.bad_words or []))
    seed = body.seed if body.seed is not None else secrets.randbits(63)
    jobs = []
    for i, p in enumerate(prompts):
        if not p:
            raise RequestError("prompt is empty", "prompt")
        if any(t < 0 or t >= host.vocab_size for t in p):
            raise RequestError(f"prompt has token ids outside [0, {host.vocab_size})", "prompt")
        budget = max_tokens if max_tokens is not None else host.max_len - len(p)
        if budget < 1 or len(p) + budget > host.max_len:
            raise RequestError(f"This model's maximum context length is {host.max_len} tokens. However, you "
                               f"requested {len(p) + max(budget, 1)} tokens ({len(p)} in the prompt, {max(budget, 1)} "
                               "in the completion). Please reduce the length of the prompt or max_tokens.",
                               "max_tokens")
        params = dataclasses.replace(base, max_tokens=budget)
        jobs += [(p, params, derive_seed(seed, "choice", i, j)) for j in range(body.n)]
    return jobs
