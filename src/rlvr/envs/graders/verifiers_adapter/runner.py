"""A private event loop in a daemon thread, for running verifiers' coroutines from synchronous code.

verifiers' rubrics, ``env_response`` and stop conditions are ``async``; rlvr calls ``reward_fn``
and ``interact`` synchronously, from plain threads and from inside its own running event loop.
:class:`AsyncRunner` owns one loop per environment, started on first use, so a coroutine always
runs on the same loop (objects it caches, such as an HTTP client, stay bound to that loop) and a
caller in another loop never has to be re-entered. Standard library only.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


class AsyncRunner:
    """``run(coro, timeout)`` runs ``coro`` on the private loop and waits for its result."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._loop: asyncio.AbstractEventLoop | None = None
        self._lock = threading.Lock()

    def run(self, coro: Coroutine[Any, Any, T], timeout: float | None, what: str) -> T:
        """``coro``'s result; past ``timeout`` seconds it is cancelled and ``TimeoutError`` names ``what``."""
        future = asyncio.run_coroutine_threadsafe(coro, self._event_loop())
        try:
            return future.result(timeout)
        except TimeoutError:
            future.cancel()
            raise TimeoutError(f"{what} did not finish within {timeout}s") from None

    def _event_loop(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None or self._loop.is_closed():
                loop = asyncio.new_event_loop()
                threading.Thread(target=_run_loop, args=(loop,), daemon=True,
                                 name=f"rlvr-verifiers-{self.name}").start()
                self._loop = loop
            return self._loop

    def close(self) -> None:
        """Cancel what is still running and stop the loop (a later ``run`` starts a new one)."""
        with self._lock:
            loop, self._loop = self._loop, None
        if loop is None or loop.is_closed():
            return
        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(_cancel_pending(), loop).result(5)
        loop.call_soon_threadsafe(loop.stop)


def _run_loop(loop: asyncio.AbstractEventLoop) -> None:
    asyncio.set_event_loop(loop)
    try:
        loop.run_forever()
    finally:
        loop.close()


async def _cancel_pending() -> None:
    tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
