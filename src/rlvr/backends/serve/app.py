"""rlvr's own OpenAI-compatible inference server for small models (``rlvr serve``).

It exists so that the HTTP sampler and every weight-sync lane run for real without vLLM: the
same endpoints and request/response shapes as vLLM's OpenAI server (``/v1/models``,
``/v1/models/{id}``, ``/v1/completions`` with token-id prompts and ``return_token_ids``,
``/v1/chat/completions``, both streamed on request, ``/v1/load_lora_adapter``,
``/v1/unload_lora_adapter``, ``/health``, ``/version``, errors as
``{"error": {"message", "type", "param", "code"}}``), plus ``POST /rlvr/reload_weights`` for
full-weight reloads from disk, and SGLang's native ``/generate`` and weight routes
(:mod:`~rlvr.backends.serve.sglang_routes`). This module is the app and its guards; request fields live in
:mod:`~rlvr.backends.serve.requests` (every field honoured or refused by name), chat rendering and
tool calls in :mod:`~rlvr.backends.serve.chat`, answers in :mod:`~rlvr.backends.serve.completions`
and :mod:`~rlvr.backends.serve.streaming`.

Invariants:
- One :class:`~rlvr.backends.serve.model_host.ModelHost` generates for every client, so concurrent
  requests are batched (one batch per adapter) with decode steps interleaved between requests
  (:mod:`~rlvr.backends.serve.scheduler`), and each response carries the policy version that
  produced it (``rlvr_policy_version``, an extra field vLLM does not have).
- A client that disconnects stops its generation: its jobs are cancelled and their rows stop at the
  next decode step (a whole answer: :mod:`~rlvr.backends.disconnect`; a stream: when its next chunk
  finds nobody), so the model never keeps generating for nobody while other clients wait.
- Log-probs are those of the distribution sampled from (logits / temperature), exactly what
  :func:`~rlvr.backends.model.io.token_logprobs` gives for the same tokens. vLLM's equivalent is
  ``--logprobs-mode processed_logprobs``; ``top_logprobs`` (up to 20) are the most likely tokens of
  that same distribution.
- ``prompt_logprobs=0`` answers, per choice, vLLM's list: ``None`` for the first prompt token, then
  ``{"<id>": {"logprob", "rank", "decoded_token"}}`` for each later one, the model's (or adapter's)
  own distribution at temperature 1 whatever the request's temperature, as vLLM does; computed by
  the same batches as generation (a forward pass), so never across a weight change. This is what
  a frozen teacher is scored through (:mod:`rlvr.backends.sample.scoring`).
- LoRA: the base model is held once; each loaded adapter is a named PEFT adapter selected per
  batch (see :mod:`rlvr.backends.serve.model_host`).
- Secure by default (:class:`~rlvr.backends.serve.model_host.ServerPolicy`): loopback (every address
  the host resolves to) unless an API key is set; adapters and weights load only from the folders
  allowed at start-up; bodies (size and arrival time), samples per request and requests in flight
  are bounded, a request's slot taken only once its body has arrived; chat templates render in
  bounded worker processes (:mod:`~rlvr.backends.serve.render`); web pages are kept out
  (:mod:`~rlvr.backends.web_guard`: a foreign Host or Origin, a body that is not JSON); ``/health``
  is never refused;
  every string is checked for NUL bytes and lone surrogates; every refused request is a 4xx that
  says why, naming the field or the limit's flag.

A backend module: imports torch, transformers, peft, fastapi and uvicorn.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import secrets
import threading
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any

import torch
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from pydantic import BaseModel, Field

import rlvr
from rlvr.backends.disconnect import while_connected
from rlvr.backends.serve.completions import chat, complete
from rlvr.backends.serve.model_host import ModelHost, ServerPolicy, error_response
from rlvr.backends.serve.requests import MAX_NAME, MAX_PATH, ChatBody, CompletionBody, check_strings, parse
from rlvr.backends.serve.sglang_routes import add_sglang_routes
from rlvr.backends.web_guard import WebGuard, is_loopback
from rlvr.errors import BackendError, RequestError, UsageError

# Idle kept-open connections outlive the clients' own expiry (httpx and the openai client close theirs
# after 5 s; uvicorn's default is 5 s too), so the client closes first and never reuses a connection
# the server is closing at that moment. Idle connections hold no in-flight slot.
KEEP_ALIVE_S = 15  # seconds (uvicorn takes an int)

STARTED = time.time()


# ---- admin request bodies ---------------------------------------------------------------------
class LoadLoraBody(BaseModel):
    lora_name: str = Field(min_length=1, max_length=MAX_NAME)
    lora_path: str = Field(min_length=1, max_length=MAX_PATH)
    load_inplace: bool = False
    policy_version: int | None = None  # rlvr extension; else read from the adapter's rlvr_version.json


class UnloadLoraBody(BaseModel):
    lora_name: str = Field(min_length=1, max_length=MAX_NAME)


class ReloadBody(BaseModel):
    path: str = Field(min_length=1, max_length=MAX_PATH)
    policy_version: int | None = None


# ---- the app ----------------------------------------------------------------------------------------
class RequestGate:
    """What every request passes before a handler runs: the key and the declared body size
    (:meth:`guard`, the middleware), then the body read within its size and time bounds and an
    in-flight slot taken once it has arrived whole (:meth:`body_of`), given back when the answer has
    been sent."""

    def __init__(self, policy: Any):
        self.policy, self.in_flight = policy, 0

    async def guard(self, request: Request, call_next: Any) -> Response:
        policy = self.policy
        if request.url.path == "/health":  # never refused: a load balancer's probe must get through
            return await call_next(request)
        if policy.api_key is not None:
            given = request.headers.get("authorization", "")
            if not secrets.compare_digest(given.encode("utf-8", "replace"), f"Bearer {policy.api_key}".encode()):
                return error_response(RequestError("a valid API key is required (Authorization: Bearer <key>)",
                                                   None, 401))
        declared = request.headers.get("content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > policy.max_body_bytes):
            return error_response(RequestError(f"the request body is over {policy.max_body_bytes} bytes", None, 413))
        request.state.slot = False
        try:
            response = await call_next(request)
        except BaseException:
            self.release(request)
            raise
        if not request.state.slot:
            return response
        inner = response.body_iterator

        async def body() -> AsyncIterator[bytes]:
            try:
                async for chunk in inner:
                    yield chunk
            finally:
                self.release(request)
        response.body_iterator = body()
        return response

    def release(self, request: Request) -> None:
        if getattr(request.state, "slot", False):
            request.state.slot = False
            self.in_flight -= 1

    async def read_body(self, request: Request) -> bytes:
        policy, raw = self.policy, bytearray()
        try:
            async with asyncio.timeout(policy.body_timeout_s):
                async for chunk in request.stream():  # a body without Content-Length is bounded too
                    raw += chunk
                    if len(raw) > policy.max_body_bytes:
                        raise RequestError(f"the request body is over {policy.max_body_bytes} bytes", None, 413)
        except TimeoutError:
            raise RequestError(f"the request body did not arrive within {policy.body_timeout_s:g} s "
                               "(rlvr serve --body-timeout-s)", None, 408) from None
        return bytes(raw)

    async def body_of(self, request: Request, model: type[BaseModel]) -> Any:
        """The parsed body; the in-flight slot is taken only once it has arrived whole, so clients
        that trickle their bodies hold no slot (and meet the body timeout)."""
        raw = await self.read_body(request)
        if self.in_flight >= self.policy.max_in_flight:
            raise RequestError(f"{self.policy.max_in_flight} requests are in flight; retry later", None, 429)
        self.in_flight += 1
        request.state.slot = True
        try:
            data = json.loads(raw)
        except RecursionError:
            raise RequestError("the request body is nested too deeply", None) from None
        except ValueError:
            raise RequestError("the request body is not valid JSON", None) from None
        if not isinstance(data, dict):
            raise RequestError("the request body must be a JSON object", None)
        check_strings(data)
        return parse(model, data)


def model_cards(host: ModelHost) -> list[dict[str, Any]]:
    """``/v1/models``' entries: the base model, then every adapter clients may name."""
    def card(name: str, root: str, parent: str | None, version: int | None, created: float) -> dict[str, Any]:
        return {"id": name, "object": "model", "created": int(created), "owned_by": "rlvr", "root": root,
                "parent": parent, "max_model_len": host.max_len, "permission": [],
                "rlvr_policy_version": version}
    data = [card(host.name, host.model_dir, None, host.base_version, STARTED)]
    data += [card(n, host.adapters[n].path, host.name, host.version_of(n), host.adapters[n].loaded_at)
             for n in host.public_adapters()]
    return data


def create_app(host: ModelHost) -> FastAPI:
    @asynccontextmanager
    async def lifespan(_app: FastAPI):
        yield
        host.close()

    app = FastAPI(title="rlvr serve", version=rlvr.__version__, lifespan=lifespan)
    app.state.host = host
    gate = RequestGate(host.policy)

    @app.exception_handler(RequestError)
    async def api_error(_request: Request, exc: RequestError) -> JSONResponse:
        return error_response(exc)

    @app.exception_handler(Exception)
    async def internal_error(_request: Request, exc: Exception) -> JSONResponse:
        return error_response(RequestError(f"{type(exc).__name__}: {exc}", None, 500))

    app.middleware("http")(gate.guard)
    _model_routes(app, host)
    _generation_routes(app, host, gate)
    _weight_routes(app, host, gate)
    add_sglang_routes(app, host, gate)  # SGLang's native /generate and weight routes, same host
    app.add_middleware(WebGuard, rules=host.policy.web_rules(), error=error_response)  # outermost: runs first
    return app


def _model_routes(app: FastAPI, host: ModelHost) -> None:
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
        return {"object": "list", "data": model_cards(host)}

    @app.get("/v1/models/{model_id:path}")
    async def model(model_id: str) -> dict[str, Any]:
        for card in model_cards(host):
            if card["id"] == model_id:
                return card
        raise RequestError(f"The model `{model_id}` does not exist.", "model", 404)


def _generation_routes(app: FastAPI, host: ModelHost, gate: RequestGate) -> None:
    @app.post("/v1/completions", response_model=None)
    async def completions(request: Request) -> dict[str, Any] | StreamingResponse:
        return await while_connected(request, complete(host, await gate.body_of(request, CompletionBody)))

    @app.post("/v1/chat/completions", response_model=None)
    async def chat_completions(request: Request) -> dict[str, Any] | StreamingResponse:
        return await while_connected(request, chat(host, await gate.body_of(request, ChatBody)))


def _weight_routes(app: FastAPI, host: ModelHost, gate: RequestGate) -> None:
    @app.post("/v1/load_lora_adapter")
    async def load_lora(request: Request) -> PlainTextResponse:
        body = await gate.body_of(request, LoadLoraBody)
        await host.load_adapter(body.lora_name, body.lora_path, body.policy_version, replace=body.load_inplace)
        return PlainTextResponse(f"Success: LoRA adapter '{body.lora_name}' added successfully.")

    @app.post("/v1/unload_lora_adapter")
    async def unload_lora(request: Request) -> PlainTextResponse:
        body = await gate.body_of(request, UnloadLoraBody)
        await host.unload_adapter(body.lora_name)
        return PlainTextResponse(f"Success: LoRA adapter '{body.lora_name}' removed successfully.")

    @app.post("/rlvr/reload_weights")
    async def reload_weights(request: Request) -> dict[str, Any]:
        body = await gate.body_of(request, ReloadBody)
        count = await host.reload_weights(body.path, body.policy_version)
        return {"success": True, "tensors": count, "policy_version": host.base_version}


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
    policy = dataclasses.replace(policy or ServerPolicy(), bind=host)  # the Host headers it answers follow
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
                                           access_log=False, timeout_graceful_shutdown=5,
                                           timeout_keep_alive=KEEP_ALIVE_S))
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
                                           access_log=False, timeout_graceful_shutdown=1,
                                           timeout_keep_alive=KEEP_ALIVE_S))
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
