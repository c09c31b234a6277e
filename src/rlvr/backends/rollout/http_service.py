"""The client of one ``rlvr rollout-worker`` (:mod:`.app`): a
:class:`~rlvr.rollouts.remote.RolloutService` over HTTP.

It sends the run's setup the first time it needs it (and again whenever the worker says it does
not hold it: the worker restarted), then each row. The key is ``api_key``, else ``$RLVR_API_KEY``;
given a ``key_file`` (the ``URL_FILE.key`` a worker that generates its key writes), a request
refused with 401 reads the file again and is sent once more when the key there changed: a worker
restarted with the same ``--url-file`` generated a new one. A transport error (refused, reset or dropped
connection, a worker that died mid-row) or a 5xx is :class:`~rlvr.errors.WorkerLost`, so the row goes
to another worker; any other refusal (a wrong key, a setup the worker will not build) is a
:class:`~rlvr.errors.BackendError` naming the worker and why, which stops the run. Reads are not cut
by a timeout here: a row takes as long as its samples, each bounded on the worker, and the adapter
bounds the whole row (:class:`~rlvr.rollouts.remote.RemoteRollouts`). One connection pool per event
loop, as the HTTP sampler keeps.

A backend module: imports httpx.
"""

from __future__ import annotations

import asyncio
import json
import os
import weakref
from pathlib import Path
from typing import Any

import httpx

from rlvr.errors import BackendError, ConfigError, WorkerLost
from rlvr.protocols import SampleOutcome
from rlvr.rollouts.remote import RowJob
from rlvr.rollouts.wire import job_to_wire, outcome_from_wire


class HTTPRolloutService:
    """One ``rlvr rollout-worker`` at ``url`` running the rollout function ``spec`` describes."""

    def __init__(self, url: str, spec: dict[str, Any], *, name: str | None = None, api_key: str | None = None,
                 key_file: str | None = None, connect_timeout_s: float = 5.0,
                 transport: httpx.AsyncBaseTransport | None = None):
        self.url, self.spec, self.key_file = url.rstrip("/"), spec, key_file
        self.name = name or f"rollout worker {self.url}"
        key = api_key or _read(key_file) or os.environ.get("RLVR_API_KEY")
        self.headers = {"Authorization": f"Bearer {key}"} if key else {}
        self.connect_timeout_s, self.transport = connect_timeout_s, transport
        self.setup_id: str | None = None
        self.pid: int | None = None
        self._clients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, httpx.AsyncClient] = \
            weakref.WeakKeyDictionary()

    def _client(self) -> httpx.AsyncClient:
        loop = asyncio.get_running_loop()
        client = self._clients.get(loop)
        if client is None:
            timeout = httpx.Timeout(None, connect=self.connect_timeout_s)
            client = self._clients[loop] = httpx.AsyncClient(timeout=timeout, headers=self.headers,
                                                             transport=self.transport)
        return client

    def _key_changed(self) -> bool:
        """Whether ``key_file`` now holds another key (then taken for every later request)."""
        key = _read(self.key_file)
        if not key or self.headers.get("Authorization") == f"Bearer {key}":
            return False
        self.headers["Authorization"] = f"Bearer {key}"
        for client in list(self._clients.values()):
            client.headers["Authorization"] = self.headers["Authorization"]
        return True

    async def _post(self, path: str, body: dict[str, Any]) -> httpx.Response:
        try:
            for _ in range(2):
                response = await self._client().post(f"{self.url}{path}", content=json.dumps(body),
                                                      headers={"content-type": "application/json"})
                if response.status_code != 401 or not self._key_changed():
                    break
        except httpx.TransportError as exc:
            raise WorkerLost(f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__) from None
        if response.status_code >= 500:
            raise WorkerLost(f"HTTP {response.status_code}: {_message(response)}")
        return response

    async def _setup(self) -> str:
        response = await self._post("/v1/rollouts/setup", self.spec)
        if response.status_code != 200:
            raise BackendError(f"{self.name} refused the run's setup with HTTP {response.status_code}: "
                               f"{_message(response)}")
        self.setup_id = json.loads(response.text)["setup"]
        await self._where()
        return self.setup_id

    async def _where(self) -> None:
        try:
            response = await self._client().get(f"{self.url}/version")
            self.pid = json.loads(response.text).get("pid")
        except (httpx.HTTPError, ValueError, AttributeError):
            pass

    def check(self, field: str = "cluster.rollout_urls") -> None:
        """Before the run: the worker answers (and says its process id), else a ConfigError naming ``field``."""
        try:
            response = httpx.get(f"{self.url}/version", headers=self.headers, timeout=self.connect_timeout_s + 5)
        except httpx.HTTPError as exc:
            raise ConfigError(f"{field}: nothing answers at {self.url} ({type(exc).__name__}); start it with "
                              "`rlvr rollout-worker --port PORT`") from None
        if response.status_code != 200:
            raise ConfigError(f"{field}: {self.url} answered HTTP {response.status_code} ({_message(response)}); is it "
                              "an rlvr rollout-worker, and is its key in cluster.rollout_key_file (the URL_FILE.key "
                              "it wrote, when it generated one) or RLVR_API_KEY?")
        try:
            self.pid = json.loads(response.text).get("pid")
        except (ValueError, AttributeError):
            raise ConfigError(f"{field}: {self.url} is not an rlvr rollout-worker (GET /version: "
                              f"{response.text[:100]!r})") from None

    async def run_row(self, job: RowJob) -> list[SampleOutcome]:
        for attempt in (1, 2):
            sid = self.setup_id or await self._setup()
            response = await self._post("/v1/rollouts/row", {"setup": sid, "job": job_to_wire(job)})
            if response.status_code == 404 and _code(response) == "unknown_setup" and attempt == 1:
                self.setup_id = None  # the worker restarted: it needs the setup again
                continue
            if response.status_code != 200:
                raise BackendError(f"{self.name} refused row {job.task.id!r} with HTTP {response.status_code}: "
                                   f"{_message(response)}")
            return [outcome_from_wire(o) for o in json.loads(response.text)["outcomes"]]
        raise AssertionError("unreachable")

    async def ping(self) -> bool:
        try:
            response = await self._client().get(f"{self.url}/health", timeout=self.connect_timeout_s)
        except httpx.HTTPError:
            return False
        if response.status_code == 200:
            await self._where()
        return response.status_code == 200

    def where(self) -> dict[str, Any]:
        return {"kind": "http", "url": self.url, "pid": self.pid}

    def close(self) -> None:
        self._clients = weakref.WeakKeyDictionary()  # each pool closes with its event loop


def _read(path: str | None) -> str | None:
    if path is None:
        return None
    try:
        lines = Path(path).expanduser().read_text().strip().splitlines()
        return lines[0] if lines else None
    except (OSError, UnicodeDecodeError):
        return None


def _message(response: httpx.Response) -> str:
    try:
        error = json.loads(response.text).get("error", {})
        return str(error.get("message") or error)[:500]
    except (ValueError, AttributeError):
        return response.text[:500] or response.reason_phrase


def _code(response: httpx.Response) -> str | None:
    try:
        return json.loads(response.text).get("error", {}).get("code")
    except (ValueError, AttributeError):
        return None
