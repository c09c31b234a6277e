"""Environments and procedural tasks: where rows and rewards come from.

:func:`procedural_task` names the generators that need no download, each as
``(make_rows(n, *, seed, **params), reward_fn(messages, answer))``. :func:`environment` loads an
environment from a built-in name (a procedural task, or one of :data:`BUILTIN_ENVS`), an import
path or a file (see :func:`rlvr.envs.loading.load_environment`).

Layout: ``loading`` (spec → environment) · ``parsing`` and ``answers`` (reading replies) ·
``tasks/`` (procedural row generators) · ``graders/`` (exact match, math-verify, the ``verifiers``
adapter) · ``multiturn/`` (retry, tools, retrieval) · ``coding/`` (repositories an agent edits, their
tests the reward) · ``services/`` (calculator, sandbox, search).
Built-ins are named here by import path and imported only when asked for, so importing this
package loads none of them. Standard library only; optional dependencies are imported lazily.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import replace
from functools import partial
from typing import Any

from rlvr.envs.loading import load_environment, load_object
from rlvr.errors import ConfigError
from rlvr.protocols import LoadedEnv

RowMaker = Callable[..., list[dict[str, Any]]]
RewardFn = Callable[[list[dict[str, Any]], Any], float]

# name -> (module, keyword arguments bound to its make_rows)
PROCEDURAL: dict[str, tuple[str, dict[str, Any]]] = {
    "addition": ("rlvr.envs.tasks.arithmetic", {"ops": ("+",)}),
    "arithmetic": ("rlvr.envs.tasks.arithmetic", {}),
    "countdown": ("rlvr.envs.tasks.countdown", {}),
    "reverse_text": ("rlvr.envs.tasks.reverse_text", {}),
    "sorting": ("rlvr.envs.tasks.sorting", {}),
    "word_problems": ("rlvr.envs.tasks.word_problems", {}),
}


def procedural_task(name: str) -> tuple[RowMaker, RewardFn]:
    """``(make_rows, reward_fn)`` of the procedural task ``name``."""
    try:
        module_name, bound = PROCEDURAL[name]
    except KeyError:
        raise ConfigError(f"task.name={name!r} is not a procedural task; known: {sorted(PROCEDURAL)}") from None
    module = importlib.import_module(module_name)
    return (partial(module.make_rows, **bound) if bound else module.make_rows), module.reward_fn


BUILTIN_ENVS: dict[str, str] = {
    "exact_match": "rlvr.envs.graders.exact_match:ExactMatch",
    "math": "rlvr.envs.graders.math:MathVerify",
    "retry": "rlvr.envs.multiturn.retry:RetryEnv",
    "tools": "rlvr.envs.multiturn.tools:ToolEnv",
    "retrieval": "rlvr.envs.multiturn.retrieval:RetrievalEnv",
    "verifiers": "rlvr.envs.graders.verifiers_adapter:load_environment",  # env_args = {env_id = ...}
    "coding": "rlvr.envs.coding:CodingEnv",  # repositories with a planted bug; their tests, sandboxed, pay
}

# Multi-turn built-ins sized for the tiny character-level demo model (plain answers, short tags).
TERSE_ENVS: dict[str, str] = {
    "retry_terse": "rlvr.envs.multiturn.retry:terse",          # "37+45=" -> "82"; wrong -> "again=", 2 turns
    "tools_terse": "rlvr.envs.multiturn.tools:terse",          # "412*37=" -> "<t>c:412*37</t>" -> "15244"
    "retrieval_terse": "rlvr.envs.multiturn.retrieval:terse",  # "code of kavo?" -> "<s>kavo</s>" -> "417"
}


def environment(spec: str, **kwargs: Any) -> LoadedEnv:
    """The environment ``spec`` names: a procedural task, a built-in, ``verifiers:ENV_ID`` (an installed
    verifiers environment), ``openenv:package.module:Class`` (an OpenEnv environment), ``verifiers-v1:TASKSET_ID`` (a
    verifiers 0.4 taskset; both played through the recording proxy, :mod:`rlvr.envs.hubs`),
    an import path or a file."""
    if spec.startswith("verifiers:"):
        from rlvr.envs.graders.verifiers_adapter import from_verifiers

        return replace(load_environment(from_verifiers(spec.removeprefix("verifiers:"), **kwargs)), spec=spec)
    if spec.startswith("openenv:"):  # played through the recording proxy by the hub worker
        return importlib.import_module("rlvr.envs.hubs").openenv_env(spec.removeprefix("openenv:"), **kwargs)
    if spec.startswith("verifiers-v1:"):  # verifiers 0.4's v1 harness, through the proxy, in the hub worker
        return importlib.import_module("rlvr.envs.hubs").verifiers_v1_env(spec.removeprefix("verifiers-v1:"),
                                                                          **kwargs)
    if spec in PROCEDURAL:
        if kwargs:
            raise ConfigError(f"the procedural task {spec!r} takes no env_args; use task.params for its rows")
        make_rows, reward_fn = procedural_task(spec)
        return LoadedEnv(spec, reward_fn, None, make_rows, spec)
    if spec.startswith("trl:"):  # a TRL batch reward (see rlvr.envs.trl)
        if kwargs:
            raise ConfigError(f"the TRL reward {spec!r} takes no env_args")
        return importlib.import_module("rlvr.envs.trl").trl_env(spec)
    if spec in TERSE_ENVS:
        return load_environment(load_object(TERSE_ENVS[spec])(**kwargs))
    return load_environment(BUILTIN_ENVS.get(spec, spec), **kwargs)
