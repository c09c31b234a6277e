"""rlvr's own OpenAI-compatible inference server for small models (``rlvr serve``).

It exists so that the HTTP sampler and every weight-sync lane run for real without vLLM: the
same endpoints and request/response shapes as vLLM's OpenAI server (``/v1/models``,
``/v1/completions`` with token-id prompts and ``return_token_ids``, ``/v1/chat/completions``,
``/v1/load_lora_adapter``, ``/v1/unload_lora_adapter``, ``/health``, ``/version``, errors as
``{"error": {"message", "type", "param", "code"}}``), plus ``POST /rlvr/reload_weights`` for
full-weight reloads from disk.

Invariants:
- One :class:`~rlvr.backends.serve.model_host.ModelHost` generates for every client, so concurrent
  requests are batched (one batch per adapter), and each response carries the policy version that
  produced it (``rlvr_policy_version``, an extra field vLLM does not have).
- Log-probs are those of the distribution sampled from (logits / temperature), exactly what
  :func:`~rlvr.backends.model.io.token_logprobs` gives for the same tokens. vLLM's equivalent is
  ``--logprobs-mode processed_logprobs``. ``top_logprobs`` holds only the sampled token.
- ``prompt_logprobs=0`` answers, per choice, vLLM's list: ``None`` for the first prompt token, then
  ``{"<id>": {"logprob", "rank", "decoded_token"}}`` for each later one, the model's (or adapter's)
  own distribution at temperature 1 whatever the request's temperature, as vLLM does; computed by
  the same batches as generation (a forward pass), so never across a weight change. This is what
  a frozen teacher is scored through (:mod:`rlvr.backends.sample.scoring`).
- LoRA: the base model is held once; each loaded adapter is a named PEFT adapter selected per
  batch (see :mod:`rlvr.backends.serve.model_host`).
- Secure by default (:class:`~rlvr.backends.serve.model_host.ServerPolicy`): loopback unless an API
  key is set; adapters and weights load only from the folders allowed at start-up; bodies, samples
  per request and requests in flight are bounded; batches take turns between requests, so one
  client cannot starve the others; every refused request is a 4xx that says why.

A backend module: imports torch, transformers, peft, fastapi and uvicorn.
"""

from __future__ import annotations

import json
import os
import secrets
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from typing import Any

import torch
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from pydantic import BaseModel, ConfigDict, Field, StrictInt, ValidationError

import rlvr
from rlvr.backends.model.io import render_prompt_ids
from rlvr.backends.serve.model_host import ModelHost, ServerPolicy, error_response
from rlvr.errors import BackendError, RequestError, UsageError
from rlvr.seeding import derive_seed
from rlvr.types import Completion, SamplingParams

MAX_N = 256
STARTED = time.time()
GREEDY_BELOW = 1e-5  # a temperature under this samples greedily, as vLLM does
LOOPBACK = ("127.", "::1", "localhost")


def is_loopback(host: str) -> bool:
    return host.startswith(LOOPBACK)


# ---- request bodies ---------------------------------------------------------------------------
class _Sampling(BaseModel):
    model_config = ConfigDict(extra="allow")  # vLLM ignores unknown fields too

    model: str | None = None
    n: int = Field(1, ge=1, le=MAX_N)
    max_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0.0, allow_inf_nan=False)
    top_p: float | None = Field(None, gt=0.0, le=1.0, allow_inf_nan=False)
    seed: int | None = None
    stop: str | list[str] | None = Field(None, max_length=64)
    return_token_ids: bool = False
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    stream: bool = False
    # Knobs that would reshape the distribution: accepted only at their neutral value.
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    top_k: int | None = None
    min_p: float = 0.0
    logit_bias: dict[str, float] | None = None
    ignore_eos: bool = False
    use_beam_search: bool = False


class CompletionBody(_Sampling):
    prompt: str | list[StrictInt] | list[str] | list[list[StrictInt]]
    logprobs: int | None = Field(None, ge=0)
    echo: bool = False
    best_of: int | None = None
    suffix: str | None = None
    prompt_logprobs: int | None = None
    return_tokens_as_token_ids: bool = False


class ChatBody(_Sampling):
    messages: list[dict[str, Any]] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0)


class LoadLoraBody(BaseModel):
    lora_name: str = Field(min_length=1)
    lora_path: str = Field(min_length=1)
    load_inplace: bool = False
    policy_version: int | None = None  # rlvr extension; else read from the adapter's rlvr_version.json


class UnloadLoraBody(BaseModel):
    lora_name: str = Field(min_length=1)


class ReloadBody(BaseModel):
    path: str = Field(min_length=1)
    policy_version: int | None = None


def _parse(model: type[BaseModel], body: Any) -> Any:
    try:
        return model.model_validate(body)
    except ValidationError as exc:
        err = exc.errors()[0]
        field = str(err["loc"][0]) if err["loc"] else None
        raise RequestError(f"{field or 'body'}: {err['msg']}", field) from None


def _refuse_unsupported(body: _Sampling) -> None:
    stops = [body.stop] if isinstance(body.stop, str) else list(body.stop or [])
    if any(not s for s in stops):
        raise RequestError("stop strings must be non-empty", "stop")
    neutral = {"stream": False, "presence_penalty": 0.0, "frequency_penalty": 0.0, "repetition_penalty": 1.0,
               "min_p": 0.0, "ignore_eos": False, "use_beam_search": False, "echo": False, "suffix": None}
    for field, value in neutral.items():
        if getattr(body, field, value) != value:
            raise RequestError(f"{field}={getattr(body, field)!r} is not supported by rlvr serve", field)
    if body.top_k not in (None, -1, 0):
        raise RequestError("top_k is not supported by rlvr serve (use -1 or leave it out)", "top_k")
    if body.logit_bias:
        raise RequestError("logit_bias is not supported by rlvr serve", "logit_bias")
    if getattr(body, "best_of", None) not in (None, body.n):
        raise RequestError("best_of must equal n (or be left out)", "best_of")


# ---- response building ----------------------------------------------------------------------------
@dataclass(slots=True)
class _Choice:
    ids: list[int]
    logprobs: list[float]
    text: str
    finish_reason: str
    stop_reason: str | None


def _finish(host: ModelHost, out: Completion, stops: list[str], body: _Sampling) -> _Choice:
    """Decode a completion and cut it at the first stop string (the token that completes it kept)."""
    def decode(ids: list[int]) -> str:
        return host.tokenizer.decode(ids, skip_special_tokens=body.skip_special_tokens)

    ids, logprobs = list(out.ids), list(out.logprobs)
    text = decode(ids)
    finish = "stop" if out.stop_reason == "stop" else "length"
    if stops and any(s in text for s in stops):
        for end in range(1, len(ids) + 1):
            prefix = decode(ids[:end])
            hits = [(prefix.find(s), s) for s in stops if s in prefix]
            if hits:
                at, stop = min(hits)
                cut = prefix[:at] + (stop if body.include_stop_str_in_output else "")
                return _Choice(ids[:end], logprobs[:end], cut, "stop", stop)
    return _Choice(ids, logprobs, text, finish, None)


def _jobs(host: ModelHost, prompts: list[list[int]], body: _Sampling, max_tokens: int
          ) -> list[tuple[list[int], SamplingParams, int]]:
    temperature = 1.0 if body.temperature is None else body.temperature
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0 if temperature < GREEDY_BELOW else temperature,
                            top_p=1.0 if body.top_p is None else body.top_p)
    if len(prompts) * body.n > host.policy.max_samples:
        raise RequestError(f"{len(prompts)} prompts x n={body.n} = {len(prompts) * body.n} samples; this server takes "
                           f"at most {host.policy.max_samples} per request (split it)", "n")
    seed = body.seed if body.seed is not None else secrets.randbits(63)
    for p in prompts:
        if not p:
            raise RequestError("prompt is empty", "prompt")
        if any(t < 0 or t >= host.vocab_size for t in p):
            raise RequestError(f"prompt has token ids outside [0, {host.vocab_size})", "prompt")
        if len(p) + max_tokens > host.max_len:
            raise RequestError(f"This model's maximum context length is {host.max_len} tokens. However, you "
                           f"requested {len(p) + max_tokens} tokens ({len(p)} in the prompt, {max_tokens} in the "
                           "completion). Please reduce the length of the prompt or max_tokens.", "max_tokens")
    return [(p, params, derive_seed(seed, "choice", i, j)) for i, p in enumerate(prompts) for j in range(body.n)]


def _completion_logprobs(host: ModelHost, c: _Choice, as_ids: bool) -> dict[str, Any]:
    tokens = [f"token_id:{t}" if as_ids else host.tokenizer.decode([t]) for t in c.ids]
    offsets, at = [], 0
    for token in tokens:
        offsets.append(at)
        at += len(token)
    return {"text_offset": offsets, "token_logprobs": c.logprobs, "tokens": tokens,
            "top_logprobs": [{tok: lp} for tok, lp in zip(tokens, c.logprobs, strict=True)]}


def _prompt_logprobs(host: ModelHost, prompt: list[int], scored: tuple[list[float], list[int]]
                     ) -> list[dict[str, dict[str, Any]] | None]:
    """vLLM's per-prompt list: ``None`` for the first token (nothing before it), then one entry per
    token keyed by its id. vLLM decodes ``decoded_token`` even with ``return_tokens_as_token_ids``."""
    logprobs, ranks = scored
    entries = [{str(t): {"logprob": lp, "rank": rank, "decoded_token": host.tokenizer.decode([t])}}
               for t, lp, rank in zip(prompt[1:], logprobs, ranks, strict=True)]
    return [None, *entries]


def _usage(prompt_tokens: int, choices: list[_Choice]) -> dict[str, int]:
    completion = sum(len(c.ids) for c in choices)
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion,
            "total_tokens": prompt_tokens + completion}


def _prompts_of(host: ModelHost, prompt: Any) -> list[list[int]]:
    if isinstance(prompt, str):
        prompt = [prompt]
    if prompt and isinstance(prompt[0], int):
        return [list(prompt)]
    if not prompt:
        raise RequestError("prompt is empty", "prompt")
    return [list(host.tokenizer(p)["input_ids"]) if isinstance(p, str) else list(p) for p in prompt]


async def _complete(host: ModelHost, body: CompletionBody) -> dict[str, Any]:
    _refuse_unsupported(body)
    if body.logprobs is not None and body.logprobs > 1:
        raise RequestError("logprobs > 1 is not supported by rlvr serve (only the sampled token's)", "logprobs")
    if body.prompt_logprobs not in (None, 0):
        raise RequestError(f"prompt_logprobs={body.prompt_logprobs} is not supported by rlvr serve: only 0 (each "
                           "prompt token's own log-prob) or leaving it out", "prompt_logprobs")
    adapter = host.resolve(body.model)
    prompts = _prompts_of(host, body.prompt)
    jobs = _jobs(host, prompts, body, body.max_tokens or 16)
    stops = [body.stop] if isinstance(body.stop, str) else list(body.stop or [])
    scored = prompts if body.prompt_logprobs is not None else []
    outs, scores, version = await host.generate_scored(adapter, jobs, scored)
    choices = [_finish(host, out, stops, body) for out in outs]
    per_prompt = [_prompt_logprobs(host, p, s) for p, s in zip(scored, scores, strict=True)]
    rows = []
    for index, c in enumerate(choices):
        row: dict[str, Any] = {"index": index, "text": c.text, "logprobs": None, "finish_reason": c.finish_reason,
                               "stop_reason": c.stop_reason,
                               "prompt_logprobs": per_prompt[index // body.n] if per_prompt else None}
        if body.logprobs is not None:
            row["logprobs"] = _completion_logprobs(host, c, body.return_tokens_as_token_ids)
        if body.return_token_ids:
            row["prompt_token_ids"] = prompts[index // body.n]
            row["token_ids"] = c.ids
        rows.append(row)
    return {"id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion", "created": int(time.time()),
            "model": body.model or host.name, "choices": rows,
            "usage": _usage(sum(map(len, prompts)) * body.n, choices), "rlvr_policy_version": version}


def _chat_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for i, m in enumerate(messages):
        content = m.get("content")
        if isinstance(content, list):  # content parts: text only
            if not all(isinstance(p, dict) and p.get("type") == "text" for p in content):
                raise RequestError(f"messages[{i}].content: only text parts are supported", "messages")
            if not all(isinstance(p.get("text", ""), str) for p in content):
                raise RequestError(f"messages[{i}].content: a text part's text must be a string", "messages")
            content = "".join(p.get("text", "") for p in content)
        if not isinstance(m.get("role"), str) or not isinstance(content, str | None):
            raise RequestError(f"messages[{i}] needs a string role and text content", "messages")
        out.append({**m, "content": content or ""})
    return out


async def _chat(host: ModelHost, body: ChatBody) -> dict[str, Any]:
    _refuse_unsupported(body)
    if body.top_logprobs and body.top_logprobs > 1:
        raise RequestError("top_logprobs > 1 is not supported by rlvr serve (only the sampled token's)", "top_logprobs")
    adapter = host.resolve(body.model)
    if not getattr(host.tokenizer, "chat_template", None):
        raise RequestError("this model's tokenizer has no chat template; use /v1/completions", "messages")
    messages = _chat_messages(body.messages)
    try:
        prompt = render_prompt_ids(host.tokenizer, messages)
    except Exception as exc:  # noqa: BLE001 - any template failure is the request's fault: a 400
        raise RequestError(f"messages could not be rendered with the chat template: {exc}", "messages") from None
    jobs = _jobs(host, [prompt], body, body.max_completion_tokens or body.max_tokens or 16)
    stops = [body.stop] if isinstance(body.stop, str) else list(body.stop or [])
    outs, version = await host.generate(adapter, jobs)
    choices = [_finish(host, out, stops, body) for out in outs]
    rows = []
    for index, c in enumerate(choices):
        row: dict[str, Any] = {"index": index, "message": {"role": "assistant", "content": c.text},
                               "logprobs": None, "finish_reason": c.finish_reason, "stop_reason": c.stop_reason}
        if body.logprobs:
            content = []
            for t, lp in zip(c.ids, c.logprobs, strict=True):
                token = host.tokenizer.decode([t])
                entry = {"token": token, "logprob": lp, "bytes": list(token.encode())}
                content.append({**entry, "top_logprobs": [entry] if body.top_logprobs else []})
            row["logprobs"] = {"content": content}
        if body.return_token_ids:
            row["token_ids"] = c.ids
        rows.append(row)
    response = {"id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion", "created": int(time.time()),
                "model": body.model or host.name, "choices": rows,
                "usage": _usage(len(prompt), choices), "rlvr_policy_version": version}
    if body.return_token_ids:
        response["prompt_token_ids"] = prompt
    return response


# ---- the app ----------------------------------------------------------------------------------------
def create_app(host: ModelHost) -> FastAPI:
    @asynccontextmanager
    async def lifespan(_app: FastAPI):
        yield
        host.close()

    app = FastAPI(title="rlvr serve", version=rlvr.__version__, lifespan=lifespan)
    app.state.host = host

    @app.exception_handler(RequestError)
    async def api_error(_request: Request, exc: RequestError) -> JSONResponse:
        return error_response(exc)

    @app.exception_handler(Exception)
    async def internal_error(_request: Request, exc: Exception) -> JSONResponse:
        return error_response(RequestError(f"{type(exc).__name__}: {exc}", None, 500))

    policy = host.policy
    in_flight = {"n": 0}

    @app.middleware("http")
    async def guard(request: Request, call_next: Any) -> Response:
        """The key, then the body-size and in-flight limits, before any handler runs."""
        if policy.api_key is not None and request.url.path != "/health":
            given = request.headers.get("authorization", "")
            if not secrets.compare_digest(given.encode(), f"Bearer {policy.api_key}".encode()):
                return error_response(RequestError("a valid API key is required (Authorization: Bearer <key>)",
                                                   None, 401))
        declared = request.headers.get("content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > policy.max_body_bytes):
            return error_response(RequestError(f"the request body is over {policy.max_body_bytes} bytes", None, 413))
        if in_flight["n"] >= policy.max_in_flight:
            return error_response(RequestError(f"{policy.max_in_flight} requests are in flight; retry later",
                                               None, 429))
        in_flight["n"] += 1
        try:
            return await call_next(request)
        finally:
            in_flight["n"] -= 1

    async def body_of(request: Request, model: type[BaseModel]) -> Any:
        raw = bytearray()
        async for chunk in request.stream():  # a body without Content-Length is bounded too
            raw += chunk
            if len(raw) > policy.max_body_bytes:
                raise RequestError(f"the request body is over {policy.max_body_bytes} bytes", None, 413)
        try:
            data = json.loads(raw)
        except RecursionError:
            raise RequestError("the request body is nested too deeply", None) from None
        except ValueError:
            raise RequestError("the request body is not valid JSON", None) from None
        if not isinstance(data, dict):
            raise RequestError("the request body must be a JSON object", None)
        return _parse(model, data)

    @app.get("/health")
    async def health() -> Response:
        return Response(status_code=200)

    @app.get("/version")
    async def version() -> dict[str, Any]:
        return {"version": rlvr.__version__, "served_policy_version": host.served_policy_version(),
                "base_policy_version": host.base_version,
                "adapters": {n: host.version_of(n) for n in host.public_adapters()}}

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        def card(name: str, root: str, parent: str | None, version: int | None, created: float) -> dict[str, Any]:
            return {"id": name, "object": "model", "created": int(created), "owned_by": "rlvr", "root": root,
                    "parent": parent, "max_model_len": host.max_len, "permission": [],
                    "rlvr_policy_version": version}
        data = [card(host.name, host.model_dir, None, host.base_version, STARTED)]
        data += [card(n, host.adapters[n].path, host.name, host.version_of(n), host.adapters[n].loaded_at)
                 for n in host.public_adapters()]
        return {"object": "list", "data": data}

    @app.post("/v1/completions")
    async def completions(request: Request) -> dict[str, Any]:
        return await _complete(host, await body_of(request, CompletionBody))

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> dict[str, Any]:
        return await _chat(host, await body_of(request, ChatBody))

    @app.post("/v1/load_lora_adapter")
    async def load_lora(request: Request) -> PlainTextResponse:
        body = await body_of(request, LoadLoraBody)
        await host.load_adapter(body.lora_name, body.lora_path, body.policy_version, replace=body.load_inplace)
        return PlainTextResponse(f"Success: LoRA adapter '{body.lora_name}' added successfully.")

    @app.post("/v1/unload_lora_adapter")
    async def unload_lora(request: Request) -> PlainTextResponse:
        body = await body_of(request, UnloadLoraBody)
        await host.unload_adapter(body.lora_name)
        return PlainTextResponse(f"Success: LoRA adapter '{body.lora_name}' removed successfully.")

    @app.post("/rlvr/reload_weights")
    async def reload_weights(request: Request) -> dict[str, Any]:
        body = await body_of(request, ReloadBody)
        count = await host.reload_weights(body.path, body.policy_version)
        return {"success": True, "tensors": count, "policy_version": host.base_version}

    return app


# ---- running it ---------------------------------------------------------------------------------------
def _watch_parent(server: uvicorn.Server, parent_pid: int, poll_s: float = 0.25) -> None:
    """Exit when the process that started this one is gone (even if it was SIGKILLed)."""

    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(poll_s)
        server.should_exit = True
        time.sleep(5.0)  # a graceful exit normally finishes well before this
        os._exit(0)

    threading.Thread(target=watch, name="rlvr-parent-watchdog", daemon=True).start()


def serve(model_dir: str, *, adapter: str | None = None, host: str = "127.0.0.1", port: int = 8000,
          device: str = "cpu", dtype: str = "float32", served_version: int | None = None,
          served_model_name: str | None = None, parent_pid: int | None = None, threads: int | None = None,
          log_level: str = "warning", policy: ServerPolicy | None = None) -> int:
    """Load the model and serve it until SIGTERM/SIGINT (or until ``parent_pid`` dies)."""
    policy = policy or ServerPolicy()
    if not is_loopback(host) and policy.api_key is None:
        raise UsageError(f"rlvr serve --host {host} is reachable beyond this machine: give --api-key (or set "
                         "RLVR_API_KEY) so that only clients holding it can sample or change the weights")
    if threads:
        torch.set_num_threads(threads)
    try:
        model_host = ModelHost(model_dir, adapter=adapter, device=device, dtype=dtype, served_version=served_version,
                               served_model_name=served_model_name, policy=policy)
    except (OSError, ValueError) as exc:  # transformers' and peft's words for "cannot load this"
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise BackendError(f"rlvr serve: cannot load {model_dir}" + (f" with adapter {adapter}" if adapter else "")
                           + f": {first}") from exc
    server = uvicorn.Server(uvicorn.Config(create_app(model_host), host=host, port=port, log_level=log_level,
                                           access_log=False, timeout_graceful_shutdown=5))
    if parent_pid is not None:
        _watch_parent(server, parent_pid)
    server.run()
    return 0


@contextmanager
def serve_in_thread(app: ModelHost | Any, *, port: int, bind: str = "127.0.0.1", timeout_s: float = 30.0
                    ) -> Iterator[str]:
    """Serve a :class:`ModelHost` (or any ASGI app) from a background thread of this process, for
    tests and benchmarks; yields the URL and stops the server on exit."""
    app = create_app(app) if isinstance(app, ModelHost) else app
    server = uvicorn.Server(uvicorn.Config(app, host=bind, port=port, log_level="warning",
                                           access_log=False, timeout_graceful_shutdown=1))
    thread = threading.Thread(target=server.run, name="rlvr-serve-thread", daemon=True)
    thread.start()
    deadline = time.monotonic() + timeout_s
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise BackendError(f"rlvr serve thread did not start on {bind}:{port} within {timeout_s}s")
        time.sleep(0.01)
    try:
        yield f"http://{bind}:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=timeout_s)
