"""The recording proxy's HTTP surface and the server that runs it: :class:`AgentProxy`.

Routes (each also under ``/s/<session>``, which is how an episode's base URL names its session):
``POST /v1/chat/completions``, ``POST /v1/completions`` (both streamed on request), ``POST
/v1/messages`` (Anthropic's shape), ``GET /v1/models``, ``GET /health``; and for trying an agent by
hand, ``GET /sessions`` (the open ones), ``GET /sessions/<id>`` (its calls, turns and segments so
far), ``POST /sessions/<id>/close`` (ends it, written to the record file). Without ``/s/<session>``
the session comes from the first of the headers ``x-multi-turn-session-id``, ``x-session-affinity``,
``x-session-id`` (the session-affinity headers routers read). Refusals use vLLM's error shape
``{"error": {"message", "type", "param", "code"}}``; a generator that fails answers 502 with its
message. A request whose client disconnects before its answer is cancelled, its generation with it
(:mod:`~rlvr.backends.disconnect`), and recorded nowhere.

The server listens on loopback only: it samples the policy for anyone who reaches it, and keeps web
pages out (:mod:`~rlvr.backends.web_guard`: a foreign Host or Origin, a body that is not JSON; other
origins only as ``allowed_origins`` lists). Chat requests render in a thread (a run's own agents) or,
given ``render`` limits (``rlvr proxy``: requests from whatever the user points at it), in a
:class:`~rlvr.backends.serve.render.RenderPool`'s worker processes, bounded in time and memory as
``rlvr serve``'s are. It runs in a thread of the process that owns the generators (a run's training
process), on its own event loop; generators are safe to call from any loop (the in-process engine,
the HTTP sampler and the server pool keep per-loop state).

A backend module: imports fastapi and uvicorn.
"""

from __future__ import annotations

import copy
import json
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from rlvr.backends.disconnect import while_connected
from rlvr.backends.proxy import anthropic_api
from rlvr.backends.proxy.openai_api import Model, chat, complete
from rlvr.backends.proxy.sessions import SESSION_HEADERS, Attempt, Closed, SessionBook, attempt_of, describe
from rlvr.backends.serve.render import RenderLimits, RenderPool
from rlvr.backends.serve.requests import ChatBody, CompletionBody, parse
from rlvr.backends.serve.tool_calls import parser_for
from rlvr.backends.web_guard import WebGuard, WebRules
from rlvr.errors import BackendError, RequestError
from rlvr.types import SamplingParams

# How long an idle client connection is kept open. Clients pool connections and drop idle ones
# themselves (httpx, the openai client's transport, after 5 s); a server that closes first (uvicorn's
# default is 5 s too) races a client reusing the connection, whose next request is then reset: an
# agent's call lost under load. Outliving the clients' expiry leaves the close to them.
KEEP_ALIVE_S = 120  # seconds (uvicorn takes an int)

_TYPES = {400: "BadRequestError", 403: "PermissionDeniedError", 404: "NotFoundError", 413: "RequestTooLargeError",
          415: "UnsupportedMediaTypeError", 499: "ClientClosedRequest", 502: "BadGatewayError"}


def error_response(exc: RequestError) -> JSONResponse:
    body = {"message": exc.message, "type": _TYPES.get(exc.status, "APIError"), "param": exc.param,
            "code": exc.status}
    return JSONResponse({"error": body}, status_code=exc.status)


def session_of(request: Request, sid: str | None) -> str | None:
    if sid is not None:
        return sid
    return next((request.headers[h] for h in SESSION_HEADERS if request.headers.get(h)), None)


async def body_of(request: Request, model: type) -> tuple[Any, Attempt]:
    """The parsed body, and the try of the client's request it is (see :func:`attempt_of`)."""
    raw = await request.body()
    try:
        data = json.loads(raw)
    except ValueError:
        raise RequestError("the request body is not valid JSON", None) from None
    if not isinstance(data, dict):
        raise RequestError("the request body must be a JSON object", None)
    return parse(model, data), attempt_of(request.headers, request.url.path, raw)


def create_app(book: SessionBook, model: Model, served_name: str = "policy",
               allowed_origins: tuple[str, ...] = ()) -> FastAPI:
    app = FastAPI(title="rlvr proxy")
    app.add_middleware(WebGuard, rules=WebRules(bind="127.0.0.1", allowed_origins=allowed_origins,
                                                command="rlvr proxy"), error=error_response)

    @app.exception_handler(RequestError)
    async def refused(_request: Request, exc: RequestError) -> JSONResponse:
        return error_response(exc)

    @app.exception_handler(BackendError)
    async def generator_failed(_request: Request, exc: BackendError) -> JSONResponse:
        return error_response(RequestError(f"the generator failed: {exc}", None, 502))

    @app.get("/health")
    async def health() -> dict[str, Any]:
        return {"status": "ok"}

    for prefix in ("", "/s/{sid}"):
        @app.get(prefix + "/v1/models")
        async def models(sid: str | None = None) -> dict[str, Any]:
            return {"object": "list", "data": [{"id": served_name, "object": "model", "owned_by": "rlvr",
                                                "max_model_len": model.max_len}]}

        @app.post(prefix + "/v1/chat/completions", response_model=None)
        async def chat_completions(request: Request, sid: str | None = None) -> Any:
            body, attempt = await body_of(request, ChatBody)
            return await while_connected(request, chat(book, model, body, session_of(request, sid), attempt))

        @app.post(prefix + "/v1/completions", response_model=None)
        async def completions(request: Request, sid: str | None = None) -> Any:
            body, attempt = await body_of(request, CompletionBody)
            return await while_connected(request, complete(book, model, body, session_of(request, sid), attempt))

        @app.post(prefix + "/v1/messages", response_model=None)
        async def messages(request: Request, sid: str | None = None) -> Any:
            body, attempt = await body_of(request, anthropic_api.MessagesBody)
            return await while_connected(request, anthropic_api.messages(book, model, body, session_of(request, sid),
                                                                         attempt))

    @app.get("/sessions")
    async def sessions() -> dict[str, Any]:
        return {"sessions": book.ids()}

    @app.get("/sessions/{sid}")
    async def peek(sid: str) -> dict[str, Any]:
        return describe(book.peek(sid), {}, tokens=True)

    @app.post("/sessions/{sid}/close")
    async def close(sid: str) -> dict[str, Any]:
        try:
            return describe(book.close(sid), {}, tokens=True)
        except KeyError:
            raise RequestError(f"proxy session {sid!r} is not open", None, 404) from None

    return app


class AgentProxy:
    """The recording proxy, served from a thread of this process on loopback.

    ``tokenizer`` renders every chat request (its chat template, with ``template_kwargs`` under the
    request's own); ``max_len`` is the model's context (``None``: unchecked); ``budget`` the
    completion tokens of a request that names none (by hand). ``default``: the generator of sessions
    nobody opened (``rlvr proxy``); a run opens one session per episode with :meth:`open` instead.
    ``record``: a JSONL file each closed session is appended to (with ``record_tokens``, its ids
    and log-probs too). ``render``: chat requests render in worker processes under these limits
    (started with the server, stopped with it); ``None``: in a thread of this process.
    ``allowed_origins``: web origins besides its own whose requests it answers. ``tool_parser``: the
    family tool calls are read in (:mod:`~rlvr.backends.serve.tool_calls`; ``auto``: from the chat
    template). ``chat_template``: a template used instead of the tokenizer's own (a run's
    ``model.chat_template``, ``rlvr proxy --chat-template``)."""

    def __init__(self, tokenizer: Any, *, template_kwargs: Mapping[str, Any] | None = None,
                 max_len: int | None = None, budget: int = 256, default: Any = None,
                 record: str | Path | None = None, record_tokens: bool = False, port: int = 0,
                 served_name: str = "policy", render: RenderLimits | None = None,
                 allowed_origins: tuple[str, ...] = (), tool_parser: str = "auto", chat_template: str | None = None):
        parser_for(tool_parser, None)  # an unknown family fails here, not at the first call
        if chat_template is not None:  # a copy: the caller's tokenizer keeps its own template
            tokenizer = copy.copy(tokenizer)
            tokenizer.chat_template = chat_template
        self.tool_parser = tool_parser
        self.book = SessionBook(default=default, budget=budget, record=record, record_tokens=record_tokens)
        self.tokenizer, self.template_kwargs, self.max_len, self.budget = tokenizer, template_kwargs, max_len, budget
        self.model = Model(tokenizer, dict(template_kwargs or {}), max_len, budget, tool_parser=tool_parser)
        self.render = render
        self.pool: RenderPool | None = None
        self.rules = WebRules(bind="127.0.0.1", allowed_origins=tuple(allowed_origins), command="rlvr proxy")
        self.port, self.served_name = port, served_name
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self.url: str | None = None

    def start(self, timeout_s: float = 30.0) -> str:
        """Serve (once; later calls return the same URL) and return the root URL."""
        with self._lock:
            if self.url is not None:
                return self.url
            if self.render is not None and self.pool is None:
                self.pool = RenderPool(self.tokenizer, self.render)
                self.model = Model(self.tokenizer, dict(self.template_kwargs or {}), self.max_len, self.budget,
                                   renderer=self.pool, tool_parser=self.tool_parser)
            app = create_app(self.book, self.model, self.served_name, self.rules.allowed_origins)
            server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning",
                                                   access_log=False, timeout_graceful_shutdown=1,
                                                   timeout_keep_alive=KEEP_ALIVE_S))
            thread = threading.Thread(target=server.run, name="rlvr-agent-proxy", daemon=True)
            thread.start()
            deadline = time.monotonic() + timeout_s
            while not server.started:
                if not thread.is_alive() or time.monotonic() > deadline:
                    raise BackendError(f"the agent proxy did not start on 127.0.0.1:{self.port} within {timeout_s}s")
                time.sleep(0.01)
            port = server.servers[0].sockets[0].getsockname()[1]
            self._server, self._thread, self.url = server, thread, f"http://127.0.0.1:{port}"
            return self.url

    def open(self, generator: Any, params: SamplingParams | None, *, seed: int | None = None,
             meta: Mapping[str, Any] | None = None, session: str | None = None) -> tuple[str, str]:
        """A new session sampling from ``generator`` under ``params`` (``None``: as each request asks),
        call seeds derived from ``seed``; returns ``(session id, its OpenAI base URL)``."""
        root = self.start()
        sid = self.book.open(generator, params, seed=seed, session=session, meta=meta)
        return sid, f"{root}/s/{sid}/v1"

    def close(self, sid: str) -> Closed:
        return self.book.close(sid)

    def stop(self) -> None:
        server, thread = self._server, self._thread
        if server is not None:
            server.should_exit = True
        if self.pool is not None:  # first: a render in flight ends with its worker, so the server's exit waits on none
            self.pool.close()
            self.pool = None
        if thread is not None:
            thread.join(timeout=10)
        self._server = self._thread = self.url = None

    def describe(self) -> dict[str, Any]:
        return {"type": f"{__name__}.{type(self).__name__}", "url": self.url}
