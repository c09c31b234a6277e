"""Environments and procedural tasks: where rows and rewards come from.

:func:`procedural_task` names the generators that need no download, each as
``(make_rows(n, *, seed, **params), reward_fn(messages, answer))``. :func:`environment` loads an
environment from a built-in name (a procedural task, or one of :data:`BUILTIN_ENVS`), an import
path or a file (see :func:`rlvr.envs.contract.load_environment`).
Standard library only; optional dependencies are imported lazily by the modules that need them.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from functools import partial
from typing import Any

from rlvr.envs import arithmetic, countdown, reverse_text, sorting
from rlvr.envs.contract import LoadedEnv, load_environment
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


BUILTIN_ENVS: dict[str, str] = {
    "exact_match": "rlvr.envs.exact_match:ExactMatch",
    "math": "rlvr.envs.math:MathVerify",
    "retry": "rlvr.envs.retry:RetryEnv",
    "tools": "rlvr.envs.tools:ToolEnv",
    "retrieval": "rlvr.envs.retrieval:RetrievalEnv",
    "verifiers": "rlvr.envs.verifiers_adapter:from_verifiers",
}

# Multi-turn built-ins sized for the tiny character-level demo model (plain answers, short tags).
TERSE_ENVS: dict[str, str] = {
    "retry_terse": "retry",          # "37+45=" -> "82"; wrong -> "again=", 2 turns
    "tools_terse": "tools",          # "412*37=" -> "<t>c:412*37</t>" -> tool "15244" -> "15244"
    "retrieval_terse": "retrieval",  # "code of kavo?" -> "<s>kavo</s>" -> passage -> "417"
}


def environment(spec: str, **kwargs: Any) -> LoadedEnv:
    """The environment ``spec`` names: a procedural task, a built-in, an import path or a file."""
    if spec in PROCEDURAL:
        if kwargs:
            raise ConfigError(f"the procedural task {spec!r} takes no env_args; use task.params for its rows")
        make_rows, reward_fn = PROCEDURAL[spec]
        return LoadedEnv(spec, reward_fn, None, make_rows, spec)
    if spec in TERSE_ENVS:
        module = importlib.import_module(f"rlvr.envs.{TERSE_ENVS[spec]}")
        return load_environment(module.terse(**kwargs))
    return load_environment(BUILTIN_ENVS.get(spec, spec), **kwargs)
