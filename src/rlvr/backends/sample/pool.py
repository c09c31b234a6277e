"""Several inference servers behind one generator: :class:`ServerPool`.

``await pool.generate(prompt_ids, params, seed=..., session_id=None)`` is the same seam as one
:class:`~rlvr.backends.sample.http.HTTPGenerator`, so the loop never knows there are several.

What it keeps invariant:
- **a group stays on one server**: calls made in one event-loop turn with the same prompt and
  parameters (a group's samples) go to one member together, which sends them as one request with
  ``n`` choices, as a single server would;
- **bounded in-flight work per server**: each member holds at most ``per_server`` requests at once;
  a request goes to the least-loaded member in rotation (round robin among equals); the rest wait;
- **a session stays on one server** (session affinity): the first request of a ``session_id`` (an
  agent episode's calls, through the recording proxy) pins it to the member it went to, and its
  later requests wait for that member rather than go elsewhere, so its prefix cache serves the whole
  episode; :meth:`server_of` names the member, :meth:`forget` drops the pin when the episode ends. A
  pinned member that leaves the pool hands its sessions to the next one chosen;
- **a dead server is taken out of rotation, never silently**: a request that fails with a
  :class:`~rlvr.errors.BackendError` (its retries spent) on a server whose process exited or that
  no longer answers ``/health`` removes that server, with a printed line and a warning for the run
  record (:meth:`take_warnings`), and the request is sent again to another one. A server that is
  healthy but answers wrongly (a malformed body, a refused request) is an error, raised as it is;
- **no server left stops the run** with a :class:`~rlvr.errors.ServersLostError` naming every server
  and why it left: recorded and checkpointed as an abort, so ``rlvr resume`` continues it.

:meth:`remove` is also how the weight-sync lane (:class:`~rlvr.backends.sync.fanout.FanoutLane`)
takes out a server that failed a publish. A backend module: imports httpx (through the members).
"""

from __future__ import annotations

import asyncio
import threading
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from rlvr.backends.sample.futures import settle
from rlvr.errors import BackendError, RequestError, ServersLostError
from rlvr.types import Completion, SamplingParams


@dataclass(slots=True)
class Member:
    """One server of the pool: its generator, how many requests it holds now, why it left (if it did)."""

    generator: Any
    name: str
    in_flight: int = 0
    removed: str | None = None

    @property
    def url(self) -> str:
        return str(getattr(self.generator, "url", self.name))


@dataclass(slots=True)
class _LoopState:
    loop: asyncio.AbstractEventLoop
    changed: asyncio.Condition
    pending: dict[tuple, list] = field(default_factory=dict)  # (prompt, params, session) -> [seeds, futures]


class ServerPool:
    """A generator (and scorer) over several servers; see the module docstring.

    ``members`` are :class:`~rlvr.backends.sample.http.HTTPGenerator` s (or anything with the same
    ``generate``/``score``, ``health`` and ``diagnose``); ``log`` prints the line a removal makes.
    """

    def __init__(self, members: Sequence[Any], *, per_server: int, health_timeout_s: float = 5.0,
                 log: Callable[[str], None] = print):
        if not members:
            raise ValueError("ServerPool needs at least one server")
        if per_server < 1:
            raise ValueError(f"ServerPool: per_server must be >= 1, got {per_server}")
        self.members = [Member(g, str(getattr(g, "url", f"server {i}"))) for i, g in enumerate(members)]
        self.per_server, self.health_timeout_s, self.log = per_server, health_timeout_s, log
        self._lock = threading.Lock()  # removals come from the sampling loop and the trainer's thread
        self._warnings: list[dict[str, Any]] = []
        self._next = 0  # round-robin start among equally loaded members
        self._pins: dict[str, Member] = {}  # session id -> the member its requests go to
        self._states: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _LoopState] = weakref.WeakKeyDictionary()
        self.failovers = 0  # requests sent again after their server left

    @property
    def alive(self) -> list[Member]:
        return [m for m in self.members if m.removed is None]

    # ---- the Generator and Scorer protocols -------------------------------------------------
    async def generate(self, prompt_ids: Sequence[int], params: SamplingParams, *, seed: int,
                       session_id: str | None = None) -> Completion:
        state = self._state()
        key = (tuple(int(t) for t in prompt_ids), params, session_id)
        future = asyncio.get_running_loop().create_future()
        if not state.pending:
            asyncio.get_running_loop().call_soon(self._flush, state)
        entry = state.pending.setdefault(key, [[], []])
        entry[0].append(seed)
        entry[1].append(future)
        return await future

    async def score(self, prompt_ids: Sequence[int], completion_ids: Sequence[int]) -> list[float]:
        return await self._on_a_server(lambda g: g.score(prompt_ids, completion_ids))

    def _flush(self, state: _LoopState) -> None:
        groups, state.pending = state.pending, {}
        for (prompt, params, session), (seeds, futures) in groups.items():
            asyncio.ensure_future(self._send_group(prompt, params, session, seeds, futures))

    async def _send_group(self, prompt: tuple[int, ...], params: SamplingParams, session: str | None,
                          seeds: list[int], futures: list[asyncio.Future]) -> None:
        async def on(generator: Any) -> list[Completion]:
            # All in one turn: the member batches them into one request with n choices.
            calls = [generator.generate(prompt, params, seed=s, session_id=session) for s in seeds]
            return list(await asyncio.gather(*calls))

        try:
            results: list[Any] = await self._on_a_server(on, session)
        except BaseException as exc:  # noqa: BLE001 - every waiter hears about it
            results = [exc] * len(futures)
        settle(futures, results)

    async def _on_a_server(self, call: Callable[[Any], Any], session: str | None = None) -> Any:
        """``call(generator)`` on the session's member, else the least-loaded live one; sent again
        elsewhere when it dies."""
        while True:
            member = await self._acquire(session)
            try:
                return await call(member.generator)
            except RequestError:
                raise  # the server refused the request: it is alive, the request is at fault
            except BackendError as exc:
                reason = await self._why_dead(member, exc)
                if reason is None:
                    raise
                self.remove(member.generator, reason)
                self.failovers += 1
            finally:
                await self._release(member)

    # ---- rotation ----------------------------------------------------------------------------
    def server_of(self, session: str) -> str | None:
        """The URL of the server ``session`` is pinned to (``None`` before its first request)."""
        with self._lock:
            member = self._pins.get(session)
        return member.url if member is not None else None

    def forget(self, session: str) -> None:
        """Drop ``session``'s pin (its episode ended)."""
        with self._lock:
            self._pins.pop(session, None)

    async def _acquire(self, session: str | None = None) -> Member:
        state = self._state()
        async with state.changed:
            while True:
                alive = self.alive
                if not alive:
                    raise self.exhausted()
                with self._lock:
                    pinned = self._pins.get(session) if session is not None else None
                if pinned is not None and pinned.removed is None:
                    if pinned.in_flight < self.per_server:
                        pinned.in_flight += 1
                        return pinned
                    await state.changed.wait()
                    continue
                free = [m for m in alive if m.in_flight < self.per_server]
                if free:
                    n, start = len(self.members), self._next
                    member = min(free, key=lambda m: (m.in_flight, (self.members.index(m) - start) % n))
                    self._next = self.members.index(member) + 1
                    member.in_flight += 1
                    if session is not None:
                        with self._lock:
                            self._pins[session] = member
                    return member
                await state.changed.wait()

    async def _release(self, member: Member) -> None:
        state = self._state()
        async with state.changed:
            member.in_flight -= 1
            state.changed.notify_all()

    async def _why_dead(self, member: Member, exc: BaseException) -> str | None:
        """Why ``member`` should leave after ``exc``: its process exited, or it stopped answering
        ``/health``; ``None`` when it is alive (then ``exc`` is an error of its own)."""
        if member.removed is not None:
            return member.removed
        diagnose = getattr(member.generator, "diagnose", None)
        cause = diagnose() if diagnose is not None else None
        if cause:
            return cause
        health = getattr(member.generator, "health", None)
        if health is not None and not await health(self.health_timeout_s):
            return f"does not answer /health after: {exc}"
        return None

    def remove(self, generator: Any, reason: str) -> bool:
        """Take the server of ``generator`` out of rotation (once), with a printed line and a warning
        event; its requests in flight fail over when they come back. True if it was in rotation."""
        with self._lock:
            member = next(m for m in self.members if m.generator is generator)
            if member.removed is not None:
                return False
            member.removed = reason
            left = len(self.alive)
            self._warnings.append({"warning": "server_removed", "server": member.url, "reason": reason,
                                   "servers_left": left})
        self.log(f"sampler: server {member.url} taken out of rotation ({reason}); {left} of "
                 f"{len(self.members)} left")
        for state in list(self._states.values()):  # wake waiters so they see the change (or none left)
            if not state.loop.is_closed():
                state.loop.call_soon_threadsafe(_wake, state.changed)
        return True

    def exhausted(self) -> ServersLostError:
        gone = "; ".join(f"{m.url}: {m.removed}" for m in self.members)
        return ServersLostError(f"no inference server left in the sampler pool ({gone}). Bring the servers back "
                            "(or fix sampler.url / sampler.replicas) and `rlvr resume` the run from its last "
                            "checkpoint")

    def take_warnings(self) -> list[dict[str, Any]]:
        """Removals since the last call, for the run record's warning events."""
        with self._lock:
            out, self._warnings = self._warnings, []
        return out

    def describe(self) -> dict[str, Any]:
        return {"type": f"{__name__}.{type(self).__name__}", "per_server": self.per_server,
                "servers": [{"url": m.url, **({"removed": m.removed} if m.removed else {})} for m in self.members]}

    async def aclose(self) -> None:
        for member in self.members:
            close = getattr(member.generator, "aclose", None)
            if close is not None:
                await close()

    def _state(self) -> _LoopState:
        loop = asyncio.get_running_loop()
        state = self._states.get(loop)
        if state is None:
            state = self._states[loop] = _LoopState(loop, asyncio.Condition())
        return state


def _wake(condition: asyncio.Condition) -> None:
    asyncio.ensure_future(_notify(condition))


async def _notify(condition: asyncio.Condition) -> None:
    async with condition:
        condition.notify_all()
