"""Work done for an HTTP client only while it is still there: :func:`while_connected`.

A request handler that generates for a client awaits its work beside a watch on the connection;
when the client goes away first (it timed out, was killed, or retries on a new connection), the
work is cancelled, so that a generation nobody will read stops at its next token (the engines and
the serve scheduler give up a job whose caller stopped waiting) and, in the recording proxy, the
call is never recorded. The handler then answers 499 (nginx's "client closed request"), which
reaches nobody.

Invariant: the watch reads the connection only after the handler has read the whole body, so it
sees nothing but the disconnect message (the ASGI servers send nothing else once a body is in).

A backend module: works on Starlette's request.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable
from typing import Any, TypeVar

from rlvr.errors import ClientGone

T = TypeVar("T")


async def _disconnected(request: Any) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def while_connected(request: Any, work: Awaitable[T]) -> T:
    """``work``'s result, or :class:`ClientGone` once ``request``'s client has disconnected first
    (``work`` cancelled and awaited, so whatever it held is released before this returns)."""
    task = asyncio.ensure_future(work)
    watch = asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait({task, watch}, return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:  # the handler itself was cancelled (server shutting down)
        task.cancel()
        raise
    finally:
        watch.cancel()
    if task.done():
        return task.result()
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError, Exception):  # nobody is there to hear how it ended
        await task
    raise ClientGone()
