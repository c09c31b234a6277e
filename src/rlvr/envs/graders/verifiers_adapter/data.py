"""The data URI ``[train|eval@]verifiers:ENV_ID[?limit=N]``: rows from a verifiers environment's dataset.

``train`` (the default) is the environment's ``dataset``, ``eval`` its ``eval_dataset``, each
built on first use. Whatever rlvr trains on, it still carves its own held-out split from those
rows, so the held-out gate measures rows the policy never trained on. The environment's eval set
is its author's benchmark: ``eval@`` trains on it (only when that is what you mean); to score a
trained model on it, serve the model (``rlvr serve``) and run ``vf-eval`` against the server.

When ``task.env`` is the same environment (``verifiers:ENV_ID``), its loaded instance (built with
``task.env_args``) gives the rows; otherwise the environment is loaded with no arguments.
Standard library only.
"""

from __future__ import annotations

from typing import Any

from rlvr.data.readers import parse_spec
from rlvr.data.tasks import load_tasks
from rlvr.errors import ConfigError
from rlvr.types import Task

PREFIX = "verifiers:"


def is_verifiers_spec(spec: Any) -> bool:
    """Whether ``spec`` is a ``verifiers:`` data URI (with or without a split and a limit)."""
    return isinstance(spec, str) and PREFIX in spec and parse_spec(spec).location.startswith(PREFIX)


def verifiers_tasks(spec: str, env: Any = None) -> list[Task]:
    """The tasks of a ``verifiers:`` data URI; ``env`` is the run's loaded environment, reused when it
    is the same verifiers environment."""
    from rlvr.envs.graders.verifiers_adapter.env import VerifiersEnv, from_verifiers

    parsed = parse_spec(spec)
    env_id = parsed.location[len(PREFIX):].strip()
    if not env_id:
        raise ConfigError(f"task.data={spec!r} names no environment; write 'verifiers:ENV_ID'")
    split = parsed.split or "train"
    source = getattr(env, "source", None)
    same = isinstance(source, VerifiersEnv) and getattr(env, "spec", None) == f"{PREFIX}{env_id}"
    adapter = source if same and isinstance(source, VerifiersEnv) else from_verifiers(env_id)
    rows = adapter.rows(split, parsed.limit)
    if not rows:
        raise ConfigError(f"task.data={spec!r}: the {split} dataset of {env_id} is empty")
    return load_tasks(rows, source=spec)
