"""Unknown config keys: every one found, each with what it most likely means and where it came from.

A run's config is assembled from several places: a TOML file, ``--section.key=value`` on the command
line, ``rlvr.train(...)`` arguments. A port from TRL or verl brings many foreign names at once, so
all unknown keys are refused in one error (never one per attempt), each with its "did you mean"
(:func:`rlvr.config.foreign_names.suggest`) and under the place it was written: ``base.toml: unknown
key loop.learning_rate: ...; command line: unknown key --loop.beta: ...``. Standard library only; the
caller (:mod:`rlvr.config.run`) passes the sections and their keys.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from rlvr.config.foreign_names import suggest
from rlvr.errors import ConfigError

COMMAND_LINE = "command line"
PYTHON = "rlvr.train"


def leaf_paths(body: Any, prefix: str) -> list[str]:
    """Every dotted path down to the leaves of a nested table (``prefix`` itself for a value)."""
    if not isinstance(body, dict) or not body:
        return [prefix]
    return [path for key, value in body.items() for path in leaf_paths(value, f"{prefix}.{key}")]


def unknown_paths(data: Mapping[str, Any], known: Mapping[str, set[str]], env_keys: Iterable[str]) -> list[str]:
    """The dotted path of every key of ``data`` no section has (``envs.NAME`` takes ``env_keys``)."""
    env_keys = set(env_keys)
    unknown: list[str] = []
    for name, body in data.items():
        if name not in known and name != "envs":
            unknown += leaf_paths(body, name)
        elif name == "envs" and isinstance(body, dict):
            unknown += [f"envs.{env}.{key}" for env, table in body.items() if isinstance(table, dict)
                        for key in table if key not in env_keys]
        elif isinstance(body, dict):  # a nested table (verl's critic.optim.lr) named down to its leaves
            unknown += [path for key in body if key not in known[name]
                        for path in leaf_paths(body[key], f"{name}.{key}")]
    return unknown


def shown(path: str, origin: str) -> str:
    """``path`` as it was written where it came from."""
    if origin == COMMAND_LINE:
        return f"--{path}"
    if origin == PYTHON:
        return f"{path}="
    return path


def refuse(unknown: Sequence[str], known: Mapping[str, set[str]], sections: Sequence[str], origin: str,
           origins: Mapping[str, str] | None = None) -> None:
    """Raise one :class:`~rlvr.errors.ConfigError` naming every ``unknown`` path, grouped by where it was
    written (``origins``: path → place; ``origin`` for the rest), each with its hint."""
    if not unknown:
        return
    groups: dict[str, list[str]] = {}
    for path in unknown:
        where = (origins or {}).get(path, origin)
        hint = _hint(path, known, sections)
        groups.setdefault(where, []).append(shown(path, where) + (f": {hint}" if hint else ""))
    parts = [f"{where}: unknown {'setting' if where == PYTHON else 'key'}{'s' if len(lines) > 1 else ''} "
             + "; ".join(lines) for where, lines in groups.items()]
    raise ConfigError(" | ".join(parts))


def _hint(path: str, known: Mapping[str, set[str]], sections: Sequence[str]) -> str | None:
    if path.startswith("envs.") and path.count(".") >= 2:  # an environment takes [task]'s keys
        _, env, key = path.split(".", 2)
        hint = suggest(f"task.{key}", known)
        return hint and hint.replace("task.", f"envs.{env}.")
    hint = suggest(path, known)
    head = path.split(".")[0]
    if hint is None and "." in path and head not in sections:
        hint = f"no section [{head}]; the sections are {', '.join(sections)}"
    if hint is None and "." not in path:
        hint = "no section of the run config has this key (rlvr.config.run.RunConfig)"
    return hint
