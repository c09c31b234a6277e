"""Ambient progress/abort hooks, bound for a scope with a ``ContextVar``.

A caller that cannot reach the ``RLLoop`` constructor (a job runner wrapping user code, a
watchdog) binds hooks for everything run inside ``with rl_hooks(...)``. The variable is
thread- and task-local. Hooks passed to ``RLLoop`` explicitly win over ambient ones.
Standard library only.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, NamedTuple


class RLHooks(NamedTuple):
    progress_cb: Callable[[Any], None] | None
    should_abort: Callable[[], bool] | None


_HOOKS: ContextVar[RLHooks] = ContextVar("rlvr_hooks", default=RLHooks(None, None))  # noqa: B039 - RLHooks is an immutable NamedTuple


@contextmanager
def rl_hooks(
    progress_cb: Callable[[Any], None] | None = None,
    should_abort: Callable[[], bool] | None = None,
) -> Iterator[RLHooks]:
    """Bind ``progress_cb`` (receives :class:`rlvr.types.Progress`) and ``should_abort``
    (polled between steps) for every loop run inside the block."""
    token = _HOOKS.set(RLHooks(progress_cb, should_abort))
    try:
        yield _HOOKS.get()
    finally:
        _HOOKS.reset(token)


def current_rl_hooks() -> RLHooks:
    """The ambient ``(progress_cb, should_abort)``; ``(None, None)`` outside any ``rl_hooks``."""
    return _HOOKS.get()
