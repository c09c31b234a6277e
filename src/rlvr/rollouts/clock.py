"""The rollout clock: what ``loop.rollout_timeout_s`` measures, and what it leaves out.

``rollout_timeout_s`` is there to catch an environment or an agent that hangs: a tool call that never
returns, an ``interact`` stuck on a lock, an agent program looping between its model calls. It does
not time a rollout's waits for the policy to generate. Those waits belong to the machine, not to the
environment: the in-process engine batches every pending request into one ``generate``, held-out and
training engines take turns on one device, and on a slow or shared CPU a row queued behind a batched
greedy generation may wait many minutes for its first token without anything being wrong. A slow
machine makes a run slow; it must not make it fail.

So the clock stops while the rollout waits for the generator:

- :func:`bounded` (the loop's wrapper around every rollout-function call, in training and held-out
  evaluation) gives each call a :class:`RolloutClock` holding ``timeout_s`` seconds of the rollout's
  own time, in a context variable the call (and every task it starts) sees;
- :class:`Clocked` wraps a generator: while any awaited call of it (``generate``, ``score``) is
  outstanding, the clock of the rollout that made it stands still. The built-in rollout functions
  (:func:`~rlvr.rollouts.episodes.single_turn`, ``multi_turn``) and the setup handed to a user's
  ``make_rollout_fn`` wrap theirs, so their generator waits are never counted;
- an agent's model calls reach the generator through the recording proxy, on the proxy's own thread
  where the context variable is not set: the agent rollout binds its clock to the generator it hands
  the proxy (``Clocked(generator, clock)``); the clock is safe to stop and start from any thread.

A call times out when its own time (wall time less the time its generator calls were outstanding)
passes ``timeout_s``; it is then cancelled, and ``TimeoutError`` names the bound. The generator's own
wait has bounds of its own where one can go wrong: an HTTP generator's ``sampler.timeout_s`` and
retries; the in-process engine answers every request (a forward pass ends, a closed engine answers
with an error). Standard library only.
"""

from __future__ import annotations

import asyncio
import inspect
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

from rlvr.errors import aborted_by
from rlvr.protocols import RolloutFn
from rlvr.types import Rollout, RolloutRequest

# How often a bound re-reads a clock that is stopped (a generation under way): it cannot run out
# meanwhile, so this is only how soon after the generation a spent budget is noticed.
STOPPED_POLL_S = 1.0

_CLOCK: ContextVar[RolloutClock | None] = ContextVar("rlvr_rollout_clock", default=None)


class RolloutClock:
    """``budget_s`` seconds of a rollout's own time: wall time since it started, less the time any
    generator call of it was outstanding. Thread-safe (an agent's calls stop it from the proxy's thread)."""

    def __init__(self, budget_s: float, *, now: Any = time.monotonic):
        self.budget_s, self._now = budget_s, now
        self._lock = threading.Lock()
        self._started = now()
        self._waiting = 0  # generator calls outstanding
        self._since: float | None = None  # when the clock stopped
        self._stopped_s = 0.0  # time stood still, over the finished waits

    @property
    def stopped(self) -> bool:
        with self._lock:
            return self._waiting > 0

    def used(self) -> float:
        """The rollout's own seconds so far."""
        with self._lock:
            now = self._now()
            still = self._stopped_s + (now - self._since if self._since is not None else 0.0)
            return now - self._started - still

    def left(self) -> float:
        return self.budget_s - self.used()

    @contextmanager
    def waiting(self) -> Iterator[None]:
        """Stand still for the block (a generator call); nested and concurrent blocks count once."""
        with self._lock:
            if self._waiting == 0:
                self._since = self._now()
            self._waiting += 1
        try:
            yield
        finally:
            with self._lock:
                self._waiting -= 1
                if self._waiting == 0 and self._since is not None:
                    self._stopped_s += self._now() - self._since
                    self._since = None


def current_clock() -> RolloutClock | None:
    """The clock of the rollout-function call running here (``None`` outside :func:`bounded`)."""
    return _CLOCK.get()


class Clocked:
    """``generator``, whose awaited calls stop a rollout's clock while outstanding: ``clock`` if given,
    else the clock of the calling rollout (:func:`current_clock`). Everything else is the generator's."""

    def __init__(self, generator: Any, clock: RolloutClock | None = None):
        self.generator, self.clock = generator, clock
        inner = generator.generate

        async def generate(*args: Any, **kwargs: Any) -> Any:
            return await self._waiting_on(inner, args, kwargs)

        # The wrapped generator's own parameters: callers that pass what it takes (a server pool's
        # session_id, which keeps an agent's episode on one replica) still see it takes them.
        generate.__signature__ = inspect.signature(inner)  # type: ignore[attr-defined]
        self.generate = generate

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.generator, name)
        if not inspect.iscoroutinefunction(attr):
            return attr

        async def call(*args: Any, **kwargs: Any) -> Any:
            return await self._waiting_on(attr, args, kwargs)

        return call

    async def _waiting_on(self, fn: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        clock = self.clock if self.clock is not None else _CLOCK.get()
        if clock is None:
            return await fn(*args, **kwargs)
        with clock.waiting():
            return await fn(*args, **kwargs)


def clocked(generator: Any) -> Any:
    """``generator`` as a :class:`Clocked` one (once: a clocked generator is returned as it is)."""
    return generator if isinstance(generator, Clocked) else Clocked(generator)


def bounded(rollout_fn: RolloutFn, timeout_s: float | None) -> RolloutFn:
    """``rollout_fn`` with each call's own time bounded by ``timeout_s`` (see the module docstring; a
    late call raises ``TimeoutError`` naming the bound); ``SystemExit`` or ``KeyboardInterrupt`` from
    user code inside it becomes an :class:`~rlvr.errors.AbortedError`, which asyncio carries like any
    other error."""

    async def guarded(request: RolloutRequest) -> Rollout | list[Rollout] | None:
        try:
            return await rollout_fn(request)
        except (SystemExit, KeyboardInterrupt) as exc:  # inside the task: asyncio would re-raise them out of its loop
            raise aborted_by(exc, f"row {request.id!r} sample {request.index}") from exc

    async def one(request: RolloutRequest) -> Rollout | list[Rollout] | None:
        if timeout_s is None:
            return await guarded(request)
        clock = RolloutClock(timeout_s)
        token = _CLOCK.set(clock)
        try:
            task = asyncio.ensure_future(guarded(request))  # the task's context holds the clock
        finally:
            _CLOCK.reset(token)
        try:
            while not task.done():
                left = clock.left()
                if left <= 0 and not clock.stopped:
                    break
                await asyncio.wait({task}, timeout=max(left, STOPPED_POLL_S) if clock.stopped else left)
            else:
                return task.result()
        finally:
            if not task.done():  # timed out, or the caller was cancelled: the rollout stops with it
                task.cancel()
                await asyncio.wait({task})
        raise TimeoutError(f"no sample within rollout_timeout_s={timeout_s:g}s of the rollout's own time "
                           "(waiting for generation not counted)")

    return one
