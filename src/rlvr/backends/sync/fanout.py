"""One weight-sync lane over several servers: :class:`FanoutLane`.

``publish(version) -> served_version`` like every lane: it calls each live server's own lane (LoRA
hot-load, disk reload, kill-and-restart: each checks the version its server serves afterwards) and
returns ``version`` once every server still in rotation confirmed it. What it keeps invariant:

- no server in rotation serves another version than the one published: a server whose publish
  fails while it is healthy (a stale version, a refused load) stops the run, naming it;
- a server whose publish fails because it died (its process exited, or it no longer answers
  ``/health``) leaves the rotation of the :class:`~rlvr.backends.sample.pool.ServerPool` with a
  warning, and the others carry on; none left is a :class:`BackendError` naming each server.

Servers are published one after the other: a publish is short next to a step, and one at a time
keeps the trainer's memory and the disk writes of a single lane. A backend module: imports httpx.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import httpx

from rlvr.backends.sample.pool import ServerPool
from rlvr.errors import BackendError


class FanoutLane:
    """``lanes[i]`` publishes to the server of ``pool.members[i]``."""

    def __init__(self, pool: ServerPool, lanes: Sequence[Callable[[int], int]], *, health_timeout_s: float = 5.0):
        if len(lanes) != len(pool.members):
            raise ValueError(f"FanoutLane: {len(lanes)} lanes for {len(pool.members)} servers")
        self.pool, self.lanes, self.health_timeout_s = pool, list(lanes), health_timeout_s

    def __call__(self, version: int) -> int:
        for member, lane in zip(self.pool.members, self.lanes, strict=True):
            if member.removed is not None:
                continue
            try:
                served = lane(version)
            except BackendError as exc:
                reason = self._why_dead(member.generator, exc)
                if reason is None:
                    raise BackendError(f"publishing version {version} to {member.url} failed while the server is "
                                       f"up: {exc}") from exc
                self.pool.remove(member.generator, reason)
                continue
            if served != version:
                raise BackendError(f"{member.url} serves policy version {served} after publishing version "
                                   f"{version}: the server is stale")
        if not self.pool.alive:
            raise self.pool.exhausted()
        return version

    def _why_dead(self, generator: Any, exc: BaseException) -> str | None:
        diagnose = getattr(generator, "diagnose", None)
        cause = diagnose() if diagnose is not None else None
        if cause:
            return cause
        url = getattr(generator, "url", None)
        if url is None:
            return None
        try:
            if httpx.get(f"{url}/health", timeout=self.health_timeout_s).status_code == 200:
                return None
        except httpx.HTTPError:
            pass
        return f"does not answer /health after a failed publish: {exc}"

    def check_compatible(self) -> None:
        for lane in self.lanes:
            check = getattr(lane, "check_compatible", None)
            if check is not None:
                check()

    def take_warnings(self) -> list[dict[str, Any]]:
        return self.pool.take_warnings()

    def close(self) -> None:
        for lane in self.lanes:
            close = getattr(lane, "close", None)
            if close is not None:
                close()

    def describe(self) -> dict[str, Any]:
        servers = []
        for member, lane in zip(self.pool.members, self.lanes, strict=True):
            inner = getattr(lane, "describe", None)
            servers.append({**(inner() if inner is not None else {"url": member.url}),
                            **({"removed": member.removed} if member.removed else {})})
        return {"type": f"{__name__}.{type(self).__name__}", "servers": servers}
