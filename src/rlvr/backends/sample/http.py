"""The HTTP sampler: a :class:`~rlvr.rollouts.episodes.Generator` (and a
:class:`~rlvr.protocols.Scorer`) over an OpenAI-compatible server.

Token in, token out: the prompt goes as token ids to ``POST /v1/completions`` with
``return_token_ids`` (vLLM >= 0.10.2: per choice ``token_ids``) and ``logprobs=1``
(``choices[0].logprobs.token_logprobs``: the log-prob of each sampled token), and
``return_tokens_as_token_ids`` so that ``logprobs.tokens`` (``"token_id:N"``) still gives the ids
on servers without ``return_token_ids``. The policy version comes from the optional
``rlvr_policy_version`` field (rlvr's server); vLLM has none, so it is the version the weight-sync
lane last confirmed (:attr:`HTTPGenerator.served_version`) when the request went out. The same code
runs against rlvr's own server (:mod:`rlvr.backends.serve.app`) and a real vLLM (the slow suite
starts one). ``top_k``, ``min_p`` and ``repetition_penalty`` are sent under vLLM's names when set.
For the importance ratio to be right, the recorded log-probs must be those of the distribution
sampled from: vLLM must run with ``--logprobs-mode processed_logprobs`` (its default is the raw
model's), which rlvr's vLLM server passes; ``rlvr serve`` always reports those.

Scoring (:meth:`Endpoint.score`) asks the same endpoint for ``prompt_logprobs=0`` over prompt +
completion (``max_tokens=1``, greedy) and reads back the completion's positions: vLLM computes
prompt log-probs from the raw model whatever the logprobs mode, i.e. at temperature 1, as does
``rlvr serve``. :class:`Endpoint` holds what the sampler and a frozen scoring endpoint
(:mod:`rlvr.backends.sample.scoring`) share: the URL and model, the per-loop pools and slots, the
bounded retried request, scoring.

Failure policy, every wait bounded:
- each attempt is cut at ``timeout_s`` (connect at ``connect_timeout_s``) whatever the server does;
- transport errors (refused, dropped, timed out) and 5xx are retried ``retries`` times with
  exponential backoff (``backoff_s * 2**i``, capped at ``max_backoff_s``, jittered down to half);
- any other status (4xx) raises :class:`~rlvr.errors.RequestError` (a :class:`BackendError` that
  carries the status and the field the server named); a malformed body, or the last failure, raises
  :class:`BackendError`; each names the server URL, the request (model, prompt length) and the status;
- at most ``max_concurrency`` requests are in flight; the rest wait for a slot, each slot being
  held at most :attr:`HTTPGenerator.max_call_s`.

A backend module: imports httpx.
"""

from __future__ import annotations

import asyncio
import math
import os
import random
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx

from rlvr.backends.sample.futures import settle
from rlvr.errors import BackendError, RequestError, TransientError, safe_repr
from rlvr.types import Completion, SamplingParams, StopReason

LOGPROB_FLOOR = -9999.0  # a non-finite or missing sampled-token log-prob is recorded as this
AFFINITY_HEADERS = ("x-multi-turn-session-id", "x-session-affinity")
_STOP = {"stop": StopReason.STOP, "length": StopReason.LENGTH, "abort": StopReason.ABORT}


def root_url(base_url: str) -> str:
    """``http://host:port`` from ``http://host:port`` or ``http://host:port/v1``."""
    return base_url.rstrip("/").removesuffix("/v1")


def served_model(base_url: str, *, timeout_s: float = 10.0, headers: Mapping[str, str] | None = None) -> str:
    """The model a server serves under its own name: the first ``id`` of its ``GET /v1/models``
    (``rlvr serve`` lists its base model first, then adapters; vLLM its ``--served-model-name``)."""
    url = f"{root_url(base_url)}/v1/models"
    headers = dict(headers or {})
    if "Authorization" not in headers and os.environ.get("RLVR_API_KEY"):
        headers["Authorization"] = f"Bearer {os.environ['RLVR_API_KEY']}"
    try:
        response = httpx.get(url, timeout=timeout_s, headers=headers)
        response.raise_for_status()
        models = [m.get("id") for m in response.json().get("data", []) if isinstance(m, dict)]
    except (httpx.HTTPError, ValueError, AttributeError) as exc:
        raise BackendError(f"cannot ask {url} which model it serves ({type(exc).__name__}: {exc}); is the server "
                           "up? name the model with --served-model-name") from None
    if not models or not isinstance(models[0], str):
        raise BackendError(f"{url} lists no model; name the model with --served-model-name")
    return models[0]


@dataclass(slots=True)
class _LoopState:
    client: httpx.AsyncClient
    slots: asyncio.Semaphore
    # (prompt, params, session) -> [seed, futures]
    pending: dict[tuple[tuple[int, ...], SamplingParams, str | None], list] = field(default_factory=dict)


class Endpoint:
    """An OpenAI-compatible server and the model name requests use: per event loop one connection
    pool and one semaphore of ``max_concurrency`` slots; every request bounded and retried as the
    module says; :meth:`score` for prompt log-probs. ``kind`` names it in error messages."""

    kind = "HTTP endpoint"

    def __init__(self, base_url: str, model: str | None, *, max_concurrency: int, timeout_s: float,
                 connect_timeout_s: float = 5.0, retries: int = 3, backoff_s: float = 0.5,
                 max_backoff_s: float = 8.0, headers: Mapping[str, str] | None = None,
                 transport: httpx.AsyncBaseTransport | None = None):
        if max_concurrency < 1 or timeout_s <= 0 or connect_timeout_s <= 0 or retries < 0 or backoff_s < 0:
            raise ValueError(f"{type(self).__name__}: max_concurrency >= 1, timeouts > 0, retries >= 0 and "
                             "backoff_s >= 0")
        self.url, self.model = root_url(base_url), model
        self.max_concurrency, self.timeout_s, self.connect_timeout_s = max_concurrency, timeout_s, connect_timeout_s
        self.retries, self.backoff_s, self.max_backoff_s = retries, backoff_s, max_backoff_s
        self.headers, self.transport = dict(headers or {}), transport
        if "Authorization" not in self.headers and os.environ.get("RLVR_API_KEY"):
            self.headers["Authorization"] = f"Bearer {os.environ['RLVR_API_KEY']}"  # the server's --api-key
        # For a server rlvr started: why it stopped answering (it exited), added to the final error.
        self.diagnose: Callable[[], str | None] = lambda: None
        self._states: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _LoopState] = weakref.WeakKeyDictionary()
        self.calls = self.retried = 0  # counters for tests and metrics

    @property
    def max_call_s(self) -> float:
        """The longest one call can take once it holds a slot: every attempt plus every backoff."""
        backoffs = sum(min(self.backoff_s * 2 ** i, self.max_backoff_s) for i in range(self.retries))
        return (self.retries + 1) * self.timeout_s + backoffs

    # ---- the Scorer protocol ----------------------------------------------------------------
    async def score(self, prompt_ids: Sequence[int], completion_ids: Sequence[int]) -> list[float]:
        """``log p(completion_ids[t] | prompt_ids + completion_ids[:t])`` for every t, at temperature 1,
        from the server's ``prompt_logprobs`` for model :attr:`model`. A missing or non-finite entry
        is a :class:`BackendError` naming the position, never a silent zero."""
        if not prompt_ids:
            raise BackendError(f"{self.kind} ({self.url}): score needs a non-empty prompt")
        if not completion_ids:
            return []
        ids = [int(t) for t in prompt_ids] + [int(t) for t in completion_ids]
        what = f"model {self.model!r}, scoring {len(completion_ids)} tokens after a prompt of {len(prompt_ids)}"
        data = await self._request("POST", "/v1/completions", what, json=self._score_body(ids))
        return self._scores(data, ids, len(completion_ids), what)

    def _score_body(self, ids: list[int]) -> dict[str, Any]:
        # One greedy token: the sampled completion is not used, only the prompt's log-probs.
        return {"model": self.model, "prompt": ids, "max_tokens": 1, "temperature": 0, "prompt_logprobs": 0}

    def _scores(self, data: Any, ids: list[int], n: int, what: str) -> list[float]:
        """The log-probs of the last ``n`` of ``ids`` from vLLM's ``prompt_logprobs``: a list with
        ``None`` first, then per token ``{"<id>": {"logprob": ..., "rank": ..., "decoded_token": ...}}``."""
        where = f"{self.kind}: POST {self.url}/v1/completions ({what})"
        choices = data.get("choices") if isinstance(data, dict) else None
        entries = choices[0].get("prompt_logprobs") if choices and isinstance(choices[0], dict) else None
        if not isinstance(entries, list) or len(entries) != len(ids):
            got = f"{len(entries)} entries" if isinstance(entries, list) else safe_repr(entries, 80)
            raise BackendError(f"{where} returned prompt_logprobs {got}, expected {len(ids)} (one per prompt "
                               "token); the server must answer prompt_logprobs=0 (vLLM, rlvr serve)")
        out = []
        for pos in range(len(ids) - n, len(ids)):
            entry = entries[pos].get(str(ids[pos])) if isinstance(entries[pos], dict) else None
            value = entry.get("logprob") if isinstance(entry, dict) else None
            if not isinstance(value, int | float) or isinstance(value, bool) or not math.isfinite(value):
                raise BackendError(f"{where}: completion position {pos - (len(ids) - n)} (prompt position {pos}, "
                                   f"token {ids[pos]}) has no finite log-prob: {safe_repr(entries[pos], 120)}")
            out.append(float(value))
        return out

    # ---- helpers ---------------------------------------------------------------------------
    async def server_version(self) -> dict[str, Any]:
        """``GET /version``: ``{"version": ...}`` (vLLM's or rlvr's), plus ``served_policy_version`` on rlvr's."""
        data = await self._request("GET", "/version", "server version")
        if not isinstance(data, dict) or "version" not in data:
            raise BackendError(f"{self.kind}: GET {self.url}/version returned {data!r}, expected {{'version': ...}}")
        return data

    async def health(self, timeout_s: float | None = None) -> bool:
        """``GET /health`` answered 200 within ``timeout_s`` (default ``connect_timeout_s``); never raises."""
        bound = timeout_s or self.connect_timeout_s
        try:
            response = await asyncio.wait_for(self._state().client.get(f"{self.url}/health", timeout=bound), bound)
            return response.status_code == 200
        except (httpx.HTTPError, TimeoutError, OSError):
            return False

    async def aclose(self) -> None:
        """Close this event loop's connection pool."""
        state = self._states.pop(asyncio.get_running_loop(), None)
        if state is not None:
            await state.client.aclose()

    def _state(self) -> _LoopState:
        # asyncio primitives and httpx pools belong to one event loop: one of each per loop.
        loop = asyncio.get_running_loop()
        state = self._states.get(loop)
        if state is None:
            timeout = httpx.Timeout(self.timeout_s, connect=self.connect_timeout_s)
            limits = httpx.Limits(max_connections=self.max_concurrency, max_keepalive_connections=self.max_concurrency)
            client = httpx.AsyncClient(timeout=timeout, limits=limits, headers=self.headers, transport=self.transport)
            state = self._states[loop] = _LoopState(client, asyncio.Semaphore(self.max_concurrency))
        return state

    async def _request(self, method: str, path: str, what: str, *, attempts: int | None = None, **kwargs: Any) -> Any:
        """``attempts`` (default ``retries + 1``) bounds the tries of this one request."""
        state = self._state()
        url = f"{self.url}{path}"
        attempts = self.retries + 1 if attempts is None else attempts
        async with state.slots:
            self.calls += 1
            last = ""
            for attempt in range(attempts):
                if attempt:
                    self.retried += 1
                    delay = min(self.backoff_s * 2 ** (attempt - 1), self.max_backoff_s)
                    await asyncio.sleep(delay * random.uniform(0.5, 1.0))
                try:
                    return await asyncio.wait_for(self._attempt(state.client, method, url, what, **kwargs),
                                                  self.timeout_s)
                except TransientError as exc:
                    last = str(exc)
                except (TimeoutError, httpx.TimeoutException):
                    last = f"no answer within {self.timeout_s:g}s"
                except httpx.TransportError as exc:
                    last = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
            cause = self.diagnose()
            raise BackendError(f"{self.kind}: {method} {url} ({what}) failed after {attempts} attempt(s): "
                              f"{last}. " + (f"The {cause}." if cause else "Is the server up? (rlvr serve / vllm)"))

    async def _attempt(self, client: httpx.AsyncClient, method: str, url: str, what: str, **kwargs: Any) -> Any:
        response = await client.request(method, url, **kwargs)
        if response.status_code >= 500 or response.status_code == 429:  # 429: the server is busy, retry later
            raise TransientError(f"HTTP {response.status_code}: {_message(response)}")
        if response.status_code != 200:
            raise RequestError(f"{self.kind}: {method} {url} ({what}) was refused with HTTP "
                               f"{response.status_code}: {_message(response)}", _param(response),
                               response.status_code)
        try:
            return response.json()
        except ValueError:
            raise BackendError(f"{self.kind}: {method} {url} ({what}) answered HTTP 200 with a body that is "
                              f"not JSON: {response.text[:200]!r}") from None


class HTTPGenerator(Endpoint):
    """``await gen.generate(prompt_ids, params, seed=..., session_id=None)`` against ``base_url``;
    ``await gen.score(prompt_ids, completion_ids)`` scores with the same model.

    ``model`` is the name requests use (the served model or a LoRA adapter name); a weight-sync
    lane may change it between calls. ``session_header`` (and ``x-multi-turn-session-id``,
    ``x-session-affinity``) carry ``session_id`` so a router can keep a multi-turn session on one
    replica (its prefix cache). ``model`` ``None``: the model the server lists first at
    ``GET /v1/models`` (:func:`served_model`), asked at the first call.
    """

    kind = "HTTP sampler"

    def __init__(self, base_url: str, model: str | None, *, max_concurrency: int = 64, timeout_s: float = 120.0,
                 connect_timeout_s: float = 5.0, retries: int = 3, backoff_s: float = 0.5,
                 max_backoff_s: float = 8.0, session_header: str = "X-Session-ID",
                 headers: Mapping[str, str] | None = None, transport: httpx.AsyncBaseTransport | None = None):
        super().__init__(base_url, model, max_concurrency=max_concurrency, timeout_s=timeout_s,
                         connect_timeout_s=connect_timeout_s, retries=retries, backoff_s=backoff_s,
                         max_backoff_s=max_backoff_s, headers=headers, transport=transport)
        self.session_header = session_header
        self.served_version: int | None = None  # set by the weight-sync lane after each confirmed publish

    # ---- the Generator protocol ------------------------------------------------------------
    async def generate(self, prompt_ids: Sequence[int], params: SamplingParams, *, seed: int,
                       session_id: str | None = None) -> Completion:
        """Calls made in one event-loop turn with the same prompt and parameters (a group's
        samples) go out as one request with ``n`` choices, seeded by the first call's seed: one
        request per group, as the server would batch them anyway, instead of one per sample."""
        if not prompt_ids:
            raise BackendError(f"HTTP sampler ({self.url}): empty prompt")
        if params.bad_words_ids:
            # The OpenAI-compatible APIs take bad words as text only (vLLM's ``bad_words``): token-id
            # sequences cannot be sent, and dropping them would sample what the caller forbade.
            raise BackendError(f"HTTP sampler ({self.url}): SamplingParams.bad_words_ids cannot be sent to a "
                               "server (its API takes bad_words as strings); use the in-process engine, or "
                               "forbid the tokens with allowed_token_ids")
        if self.model is None:  # named by the server itself, asked once it is needed (rlvr proxy --url)
            self.model = await asyncio.to_thread(served_model, self.url, headers=self.headers)
        state = self._state()
        key = (tuple(int(t) for t in prompt_ids), params, session_id)
        future = asyncio.get_running_loop().create_future()
        if not state.pending:
            asyncio.get_running_loop().call_soon(self._flush, state)
        state.pending.setdefault(key, [seed, []])[1].append(future)
        return await future

    def _flush(self, state: _LoopState) -> None:
        groups, state.pending = state.pending, {}
        for key, (seed, futures) in groups.items():
            asyncio.ensure_future(self._send(*key, seed, futures))

    async def _send(self, prompt: tuple[int, ...], params: SamplingParams, session_id: str | None, seed: int,
                    futures: list[asyncio.Future]) -> None:
        body: dict[str, Any] = {
            "model": self.model, "prompt": list(prompt), "max_tokens": params.max_tokens,
            "temperature": params.temperature, "top_p": params.top_p, "seed": seed % (1 << 63), "n": len(futures),
            "logprobs": 1, "return_token_ids": True, "return_tokens_as_token_ids": True,
        }
        body.update(optional_knobs(params))
        if params.allowed_token_ids is not None:
            body["allowed_token_ids"] = list(params.allowed_token_ids)
        # The session rides in every header routers read for affinity (SkyRL's, Fireworks', vLLM routers').
        headers = {h: session_id for h in (self.session_header, *AFFINITY_HEADERS)} if session_id is not None else None
        what = f"model {self.model!r}, prompt of {len(prompt)} tokens, n={len(futures)}"
        sent_under = self.served_version
        try:
            data = await self._request("POST", "/v1/completions", what, json=body, headers=headers)
            results: list[Any] = self._completions(data, what, len(futures), sent_under)
        except BaseException as exc:  # noqa: BLE001 - every waiter hears about it
            results = [exc] * len(futures)
        settle(futures, results)

    def _completions(self, data: Any, what: str, n: int, sent_under: int | None = None) -> list[Completion]:
        choices = data.get("choices") if isinstance(data, dict) else None
        if not isinstance(choices, list) or len(choices) != n:
            raise BackendError(f"HTTP sampler: POST {self.url}/v1/completions ({what}) returned "
                              f"{len(choices) if isinstance(choices, list) else 'no'} choices, expected {n}")
        by_index = sorted(choices, key=lambda c: c.get("index", 0) if isinstance(c, dict) else 0)
        return [self._completion({**data, "choices": [choice]}, what, sent_under) for choice in by_index]

    def _completion(self, data: Any, what: str, sent_under: int | None = None) -> Completion:
        try:
            choice = data["choices"][0]
            ids = choice.get("token_ids")
            logprobs = choice.get("logprobs") or {}
            if ids is None:  # servers without return_token_ids: "token_id:N" strings
                ids = [int(str(t).rsplit(":", 1)[1]) for t in logprobs["tokens"]]
            values = logprobs.get("token_logprobs")
            if values is None or len(values) != len(ids):
                raise ValueError(f"{len(ids)} token ids but {None if values is None else len(values)} log-probs")
            lps = tuple(float(v) if v is not None and math.isfinite(v) else LOGPROB_FLOOR for v in values)
            stop = _STOP.get(choice.get("finish_reason"), StopReason.ABORT)
            version = data.get("rlvr_policy_version", sent_under)
        except (KeyError, IndexError, TypeError, ValueError, AttributeError) as exc:
            raise BackendError(f"HTTP sampler: POST {self.url}/v1/completions ({what}) returned a body without "
                              f"token ids and log-probs ({exc}); the server must support return_token_ids or "
                              "return_tokens_as_token_ids and logprobs (vLLM >= 0.10.2)") from None
        return Completion(tuple(int(t) for t in ids), lps, stop,
                          version if isinstance(version, int) and not isinstance(version, bool) else None)


def _message(response: httpx.Response) -> str:
    """The server's own error message (vLLM: ``{"error": {"message": ...}}``), else the raw text."""
    try:
        data = response.json()
        error = data.get("error", data) if isinstance(data, dict) else data
        if isinstance(error, dict):
            detail = error.get("message") or error.get("detail") or error
            return f"{detail} (param {error['param']})" if error.get("param") else str(detail)
        return str(error)[:500]
    except ValueError:
        return response.text[:500] or response.reason_phrase


def _param(response: httpx.Response) -> str | None:
    """The field a refusal names (vLLM's and rlvr's ``error.param``), if any."""
    try:
        error = response.json().get("error")
    except (ValueError, AttributeError):
        return None
    param = error.get("param") if isinstance(error, dict) else None
    return param if isinstance(param, str) else None


def optional_knobs(params: SamplingParams) -> dict[str, Any]:
    """The sampling fields vLLM and SGLang name alike, only where they change something (a server
    without them then still serves the plain requests)."""
    out: dict[str, Any] = {}
    if params.top_k not in (0, -1):
        out["top_k"] = params.top_k
    if params.min_p:
        out["min_p"] = params.min_p
    if params.repetition_penalty != 1.0:
        out["repetition_penalty"] = params.repetition_penalty
    if params.stop:
        out["stop"] = list(params.stop)
    if params.stop_token_ids:
        out["stop_token_ids"] = list(params.stop_token_ids)
    return out
