"""``rlvr rollout-worker``: a rollout worker served over HTTP (the small protocol of remote rollouts).

Endpoints (JSON in, JSON out; errors as ``{"error": {"message", "param", "code"}}``):

- ``GET /health``: 200 once it serves.
- ``GET /version``: ``{"version": rlvr's, "pid": ..., "setups": n, "rows": n}``.
- ``POST /v1/rollouts/setup`` with a setup ``{"factory": "module:attr", "kwargs": {...}}``: builds the
  rollout function once, answers ``{"setup": ID}`` (:class:`~rlvr.backends.rollout.worker.WorkerCore`).
- ``POST /v1/rollouts/row`` with ``{"setup": ID, "job": ROW}``: runs the row's samples, answers
  ``{"outcomes": [...]}`` (:mod:`rlvr.rollouts.wire`); 404 with ``code = "unknown_setup"`` when the
  worker does not hold the setup (it restarted): the client sends the setup again. A client that
  hangs up (its row timed out, the run stopped) cancels the row.

Secure by default: every endpoint but ``/health`` needs ``Authorization: Bearer KEY``, the key given
(``--api-key`` or ``RLVR_API_KEY``) or, without one, generated at start (printed, and written beside
the ``--url-file`` as ``URL_FILE.key``, mode 600, for the training run's ``cluster.rollout_key_file``);
web pages are kept out (:mod:`~rlvr.backends.web_guard`: a foreign Host or Origin, a body that is
not JSON); a setup's factory must be a file inside an ``--allowed-dir`` folder or in an
``--allow-module`` module (rlvr's own package by default), and the environments, rewards and rollout
functions it names likewise (:class:`~rlvr.backends.rollout.worker.WorkerCore`); a setup may name
files only inside ``--allowed-dir`` folders; request bodies and rows in flight are bounded (beyond:
413, 429). A setup runs the code it names: whoever holds the key is trusted with the allowed
modules and files, as with a Ray cluster.

A backend module: imports fastapi and uvicorn.
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import socket
import threading
import time
from pathlib import Path
from typing import Any

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import Response

import rlvr
from rlvr.backends.rollout.worker import WorkerCore
from rlvr.backends.web_guard import WebGuard, WebRules, is_loopback
from rlvr.errors import RequestError, UnknownSetupError, UsageError

DISCONNECT_POLL_S = 0.5
DEFAULT_MODULES = ("rlvr",)  # the training run's own setup factory lives here


def _json(data: Any, status: int = 200) -> Response:
    # NaN stays NaN (a sample's log-prob may be one): JSON as Python writes and reads it.
    return Response(json.dumps(data), status_code=status, media_type="application/json")


def _error(exc: RequestError) -> Response:
    code = "unknown_setup" if isinstance(exc, UnknownSetupError) else None
    return _json({"error": {"message": exc.message, "param": exc.param, "code": code}}, exc.status)


async def body_of(request: Request, max_body_bytes: int) -> dict[str, Any]:
    """The request's JSON object, read within ``max_body_bytes`` (a body without Content-Length too)."""
    raw = bytearray()
    async for chunk in request.stream():
        raw += chunk
        if len(raw) > max_body_bytes:
            raise RequestError(f"the request body is over {max_body_bytes} bytes", None, 413)
    try:
        data = json.loads(raw)
    except (ValueError, RecursionError):
        raise RequestError("the request body is not valid JSON", None) from None
    if not isinstance(data, dict):
        raise RequestError("the request body must be a JSON object", None)
    return data


def create_app(core: WorkerCore, *, api_key: str | None = None, max_body_bytes: int = 32 * 2**20,
               max_in_flight: int = 256, bind: str = "127.0.0.1", allowed_origins: tuple[str, ...] = ()) -> FastAPI:
    app = FastAPI(title="rlvr rollout-worker", version=rlvr.__version__)
    in_flight = {"n": 0}

    @app.exception_handler(RequestError)
    async def refused(_request: Request, exc: RequestError) -> Response:
        return _error(exc)

    @app.exception_handler(Exception)
    async def failed(_request: Request, exc: Exception) -> Response:
        return _error(RequestError(f"{type(exc).__name__}: {exc}", None, 500))

    @app.middleware("http")
    async def guard(request: Request, call_next: Any) -> Response:
        if api_key is not None and request.url.path != "/health":
            given = request.headers.get("authorization", "")
            if not secrets.compare_digest(given.encode(), f"Bearer {api_key}".encode()):
                return _error(RequestError("a valid API key is required (Authorization: Bearer <key>)", None, 401))
        declared = request.headers.get("content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > max_body_bytes):
            return _error(RequestError(f"the request body is over {max_body_bytes} bytes", None, 413))
        if in_flight["n"] >= max_in_flight:
            return _error(RequestError(f"{max_in_flight} requests are in flight; retry later", None, 429))
        in_flight["n"] += 1
        try:
            return await call_next(request)
        finally:
            in_flight["n"] -= 1

    @app.get("/health")
    async def health() -> Response:
        return Response(status_code=200)

    @app.get("/version")
    async def version() -> Response:
        return _json({"version": rlvr.__version__, "pid": os.getpid(), "setups": len(core.fns), "rows": core.rows})

    @app.post("/v1/rollouts/setup")
    async def setup(request: Request) -> Response:
        spec = await body_of(request, max_body_bytes)
        sid = await asyncio.to_thread(core.setup, spec)  # loading a tokenizer or an environment takes a while
        return _json({"setup": sid})

    @app.post("/v1/rollouts/row")
    async def row(request: Request) -> Response:
        body = await body_of(request, max_body_bytes)
        if not isinstance(body.get("setup"), str) or not isinstance(body.get("job"), dict):
            raise RequestError("a row is {\"setup\": ID, \"job\": {...}}", "job")
        running = asyncio.ensure_future(core.run(body["setup"], body["job"]))
        while not running.done():  # the client hanging up cancels the row
            await asyncio.wait([running], timeout=DISCONNECT_POLL_S)
            if not running.done() and await request.is_disconnected():
                running.cancel()
                return Response(status_code=499)
        return _json({"outcomes": running.result()})

    rules = WebRules(bind=bind, key_required=api_key is not None, allowed_origins=allowed_origins,
                     command="rlvr rollout-worker")
    app.add_middleware(WebGuard, rules=rules, error=_error)  # outermost: runs before the key check
    return app


def _watch_parent(server: uvicorn.Server, parent_pid: int, poll_s: float = 0.25) -> None:
    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(poll_s)
        server.should_exit = True

    threading.Thread(target=watch, name="rlvr-parent-watchdog", daemon=True).start()


def serve_worker(*, host: str = "127.0.0.1", port: int = 0, api_key: str | None = None,
                 allowed_dirs: tuple[str, ...] = (), allow_modules: tuple[str, ...] = (),
                 allowed_origins: tuple[str, ...] = (), parent_pid: int | None = None, url_file: str | None = None,
                 max_in_flight: int = 256, log_level: str = "warning") -> int:
    """Serve until SIGTERM/SIGINT (or ``parent_pid`` is gone). Port 0 picks a free one; the URL is
    printed (and written to ``url_file``) once it listens. Without ``api_key`` one is generated,
    printed and written to ``url_file`` + ``.key`` (before the URL: the URL file appearing means both
    are there). ``allow_modules`` adds to :data:`DEFAULT_MODULES`."""
    generated = api_key is None
    key = secrets.token_urlsafe(32) if api_key is None else api_key
    modules = tuple(dict.fromkeys((*DEFAULT_MODULES, *allow_modules)))
    bad = [m for m in modules if not all(part.isidentifier() for part in m.split("."))]
    if bad:
        raise UsageError(f"rlvr rollout-worker --allow-module {bad[0]!r}: name a module or package, e.g. my_envs")
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    shown = f"[{host}]" if ":" in host else host
    url = f"http://{shown}:{sock.getsockname()[1]}"
    app = create_app(WorkerCore(allowed_dirs, modules), api_key=key, max_in_flight=max_in_flight, bind=host,
                     allowed_origins=allowed_origins)
    # outlive the trainer's client's 5 s idle expiry: the client closes first (see serve/app.py)
    server = uvicorn.Server(uvicorn.Config(app, log_level=log_level, access_log=False, timeout_graceful_shutdown=5,
                                           timeout_keep_alive=15))
    if parent_pid is not None:
        _watch_parent(server, parent_pid)

    def announce() -> None:
        while not server.started:
            time.sleep(0.02)
        if url_file:
            if generated:
                _write_whole(Path(f"{url_file}.key"), key, mode=0o600)
            _write_whole(Path(url_file), url)
        print(f"rlvr rollout-worker: serving on {url} (pid {os.getpid()})", flush=True)
        if generated:
            where = f"; written to {url_file}.key" if url_file else ""
            print(f"rlvr rollout-worker: generated key {key} (clients send Authorization: Bearer KEY; a training "
                  f"run reads it from cluster.rollout_key_file{where})", flush=True)
        if not is_loopback(host):
            print(f"rlvr rollout-worker: reachable beyond this machine ({host}); only clients holding the key are "
                  "answered", flush=True)

    threading.Thread(target=announce, daemon=True).start()
    server.run(sockets=[sock])
    return 0


def _write_whole(path: Path, text: str, mode: int = 0o644) -> None:
    """``text`` into ``path`` whole (renamed into place), created with ``mode`` (before the umask)."""
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, path)
