"""The policy's servers as a remote rollout worker samples them.

In the training process, :func:`served_state` reads where the run's generator points now: for each
live server its URL, the model name requests use (a weight-sync lane changes it per version, e.g.
``policy-v7``) and the version it last confirmed. Every row sent to a worker carries that state
(:class:`~rlvr.rollouts.remote.RowJob`), and the worker runs the row with it set in
:data:`SERVERS` (a context variable: each row's samples see their own row's state, concurrent rows
never mix). :class:`ServedGenerator`, the worker's generator, samples from those servers: one
:class:`~rlvr.backends.sample.http.HTTPGenerator` per server state (several servers: a
:class:`~rlvr.backends.sample.pool.ServerPool` over them), so a row sampled at version ``v`` asks
for exactly the adapter of version ``v``, and its completions carry the version the server reports
(or, for servers that report none, the version the trainer had confirmed when it sent the row).

A backend module: imports httpx (through the HTTP generator).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from contextvars import ContextVar
from typing import Any

from rlvr.backends.sample.http import HTTPGenerator
from rlvr.backends.sample.pool import ServerPool
from rlvr.errors import BackendError
from rlvr.types import Completion, SamplingParams

SERVERS: ContextVar[tuple[dict[str, Any], ...]] = ContextVar("rlvr_policy_servers", default=())
KEPT = 8  # server states whose generators are kept: a few policy versions are in flight at once


def served_state(generator: Any) -> list[dict[str, Any]]:
    """Where ``generator`` (an HTTP generator or a pool of them) samples now, server by server."""
    members = getattr(generator, "members", None)
    generators = [m.generator for m in members if m.removed is None] if members is not None else [generator]
    return [{"url": g.url, "model": g.model, "served_version": g.served_version} for g in generators]


class ServedGenerator:
    """A generator over the servers the current row names (:data:`SERVERS`); see the module docstring."""

    def __init__(self, *, max_concurrency: int = 64, timeout_s: float = 120.0, retries: int = 3):
        self.max_concurrency, self.timeout_s, self.retries = max_concurrency, timeout_s, retries
        self._generators: OrderedDict[tuple, Any] = OrderedDict()

    async def generate(self, prompt_ids: Sequence[int], params: SamplingParams, *, seed: int,
                       session_id: str | None = None) -> Completion:
        return await self._current().generate(prompt_ids, params, seed=seed, session_id=session_id)

    async def score(self, prompt_ids: Sequence[int], completion_ids: Sequence[int]) -> list[float]:
        return await self._current().score(prompt_ids, completion_ids)

    def _current(self) -> Any:
        servers = SERVERS.get()
        if not servers:
            raise BackendError("a remote rollout ran without the policy's servers: the trainer names them with "
                               "every row (sampler.backend = 'http' or 'vllm')")
        key = tuple((s["url"], s["model"], s.get("served_version")) for s in servers)
        found = self._generators.get(key)
        if found is None:
            found = self._generators[key] = self._build(servers)
            while len(self._generators) > KEPT:
                self._generators.popitem(last=False)
        self._generators.move_to_end(key)
        return found

    def _build(self, servers: Sequence[dict[str, Any]]) -> Any:
        members = []
        for s in servers:
            generator = HTTPGenerator(s["url"], s["model"], max_concurrency=self.max_concurrency,
                                      timeout_s=self.timeout_s, retries=self.retries)
            generator.served_version = s.get("served_version")
            members.append(generator)
        if len(members) == 1:
            return members[0]
        return ServerPool(members, per_server=self.max_concurrency, log=lambda _line: None)

    def describe(self) -> dict[str, Any]:
        return {"type": f"{__name__}.{type(self).__name__}", "servers": "named by each row"}
