"""Environments and procedural tasks: where rows and rewards come from.

:func:`procedural_task` names the generators that need no download, each as
``(make_rows(n, *, seed, **params), reward_fn(messages, answer))``.
Standard library only; optional dependencies are imported lazily by the modules that need them.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

from rlvr.envs import arithmetic, countdown, reverse_text, sorting
from rlvr.errors import ConfigError

RowMaker = Callable[..., list[dict[str, Any]]]
RewardFn = Callable[[list[dict[str, Any]], Any], float]

PROCEDURAL: dict[str, tuple[RowMaker, RewardFn]] = {
    "addition": (partial(arithmetic.make_rows, ops=("+",)), arithmetic.reward_fn),
    "arithmetic": (arithmetic.make_rows, arithmetic.reward_fn),
    "countdown": (countdown.make_rows, countdown.reward_fn),
    "reverse_text": (reverse_text.make_rows, reverse_text.reward_fn),
    "sorting": (sorting.make_rows, sorting.reward_fn),
}


def procedural_task(name: str) -> tuple[RowMaker, RewardFn]:
    """``(make_rows, reward_fn)`` of the procedural task ``name``."""
    try:
        return PROCEDURAL[name]
    except KeyError:
        raise ConfigError(f"task.name={name!r} is not a procedural task; known: {sorted(PROCEDURAL)}") from None
