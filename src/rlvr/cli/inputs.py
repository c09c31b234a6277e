"""What ``rlvr.train`` is given, as the run config ``rlvr train`` reads: settings by key, the model,
in-memory data and reward functions.

- **Settings by key** (:func:`place_settings`): ``max_steps=20`` is ``loop.max_steps``, ``max_new_tokens=``
  ``sampler.max_new_tokens``: a key is placed in the one section that has it. A key several sections
  have goes to ``[loop]`` when it has it (``lr``, ``seed``: the RL loop's own); otherwise it is
  ambiguous and refused, naming how to say which (``"train.share_prompts"`` or ``train={...}``). A
  section may be given whole (``sampler={"top_p": 0.9}``) and any key dotted (``**{"sft.lr": 1e-3}``).
  An unknown key gets the rlvr key it most likely means (:func:`rlvr.config.foreign_names.suggest`).
- **Data** (:func:`table_rows`): a ``datasets.Dataset``, a pandas ``DataFrame``, a list (or any iterable)
  of row dicts, or a ``task.data`` spec string (a file, ``split@org/name``). A ``DatasetDict`` is refused
  naming its splits.
- **Rewards** (:func:`reward_entries`): a function in rlvr's form ``reward_fn(messages, answer)``, a
  function in TRL's form ``fn(completions, **kwargs)`` (it names ``completions``, ``prompts`` or
  ``completion_ids``, or takes keywords only), an environment object, a spec string (``"exact_match"``,
  ``"trl:file.py:fn"``), or a list of these (summed, with ``reward_weights=[...]`` as in TRL).

In-memory objects get ``session:NAME`` specs (:mod:`rlvr.session`); the config names them as it names
files, so they go through the same readers and loaders. Part of the composition root; no torch.
"""

from __future__ import annotations

import inspect
import math
import os
from collections.abc import Iterable, Mapping
from typing import Any

from rlvr.config.run import RunConfig, section_keys
from rlvr.config.unknown_keys import PYTHON, leaf_paths, refuse
from rlvr.envs.loading import TRL_PARAMETERS
from rlvr.envs.trl import TRL_PREFIX
from rlvr.errors import ConfigError
from rlvr.reward import name_of

__all__ = ["fill", "merge", "model_section", "place_settings", "reward_entries", "setting_origins", "table_rows",
           "task_section"]

Tree = dict[str, dict[str, Any]]
LOOP_FIRST = "loop"  # a key several sections have belongs to the RL loop when it has it


def place_settings(settings: Mapping[str, Any], *, keep_unknown: bool = False) -> Tree:
    """``{key: value}`` as ``{section: {key: value}}`` (see the module doc). Unknown keys are refused
    together, in one error; with ``keep_unknown`` they stay at the top level of the tree instead, for
    :func:`~rlvr.config.run.refuse_unknown_keys` to name with the config file's own."""
    known = section_keys()
    tree: Tree = {}
    unknown: list[str] = []
    for key, value in settings.items():
        if key in RunConfig.model_fields:
            if not isinstance(value, Mapping):
                raise ConfigError(f"{key}= names the [{key}] section: give it a dict of its keys, e.g. "
                                  f"{key}={{{next(iter(sorted(known.get(key, {'...'}))))!r}: ...}}")
            _set(tree, [key], dict(value))
            continue
        if "." in key:
            _set(tree, key.split("."), value)
            continue
        homes = sorted(name for name, keys in known.items() if key in keys)
        if not homes:
            if keep_unknown:
                tree[key] = value  # type: ignore[assignment]
            unknown.append(key)
            continue
        if len(homes) > 1 and LOOP_FIRST not in homes:
            raise ConfigError(f"setting {key}= is a key of {', '.join(f'[{h}]' for h in homes)}: say which, e.g. "
                              f"**{{'{homes[0]}.{key}': ...}} or {homes[0]}={{'{key}': ...}}")
        _set(tree, [LOOP_FIRST if LOOP_FIRST in homes else homes[0], key], value)
    if not keep_unknown:
        refuse(unknown, known, list(RunConfig.model_fields), PYTHON)
    return tree


def setting_origins(tree: Mapping[str, Any]) -> dict[str, str]:
    """Each dotted path of a settings tree, as written in ``rlvr.train(...)`` (for the errors that name it)."""
    return {path: PYTHON for name, body in tree.items() for path in leaf_paths(body, name)}


def _set(tree: dict[str, Any], path: list[str], value: Any) -> None:
    node = tree
    for part in path[:-1]:
        node = node.setdefault(part, {})
        if not isinstance(node, dict):
            raise ConfigError(f"setting {'.'.join(path)}: {part!r} is not a section")
    leaf = path[-1]
    if isinstance(value, dict) and isinstance(node.get(leaf), dict):
        node[leaf] = {**node[leaf], **value}
    else:
        node[leaf] = value


def merge(base: dict[str, Any], extra: Mapping[str, Any]) -> dict[str, Any]:
    """``extra`` over ``base``, table by table (a section given in both keeps the keys of each)."""
    out = dict(base)
    for key, value in extra.items():
        out[key] = merge(out[key], value) if isinstance(value, Mapping) and isinstance(out.get(key), dict) else value
    return out


def model_section(model: Any) -> dict[str, Any]:
    """``"tiny"``: the small model built locally (the demo's); anything else names ``model.base``
    (``"smollm2"``: the shipped model, :data:`~rlvr.config.run.SHIPPED_MODELS`)."""
    if isinstance(model, os.PathLike):
        model = os.fspath(model)
    if not isinstance(model, str) or not model.strip():
        raise ConfigError(f"model= takes 'tiny', 'smollm2', a hub name, a model folder or a GGUF spec, got "
                          f"{type(model).__name__}; save a loaded model with model.save_pretrained(folder) and "
                          "pass the folder")
    return {"tiny": True} if model == "tiny" else {"base": model}


def table_rows(data: Any) -> list[dict[str, Any]]:
    """In-memory rows as plain dicts (see the module doc); numpy values become Python ones, a pandas
    missing value (NaN) a missing column."""
    kind = type(data).__name__
    if kind in ("DatasetDict", "IterableDatasetDict"):
        raise ConfigError(f"data= is a {kind} with the splits {sorted(data)}; give one split, e.g. "
                          f"data=ds[{sorted(data)[0]!r}] (rlvr carves its own held-out split from it)")
    if hasattr(data, "to_dict") and hasattr(data, "columns"):  # a pandas DataFrame
        rows: Iterable[Any] = data.to_dict("records")
    elif hasattr(data, "to_list") and hasattr(data, "column_names"):  # a datasets.Dataset
        rows = data.to_list()
    elif isinstance(data, Mapping):
        raise ConfigError("data= is one dict; give a list of rows (dicts), a datasets.Dataset or a pandas DataFrame")
    elif isinstance(data, Iterable):
        rows = data
    else:
        raise ConfigError(f"data= takes rows (a list of dicts, a datasets.Dataset, a pandas DataFrame) or a "
                          f"task.data spec string, got {kind}")
    return [{k: v for k, v in _plain(row).items() if not _missing(v)} if isinstance(row, Mapping) else row
            for row in rows]


def _plain(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if type(value).__module__.split(".")[0] == "numpy" and hasattr(value, "tolist"):
        return _plain(value.tolist())
    return value


def _missing(value: Any) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def is_trl_reward(fn: Any) -> bool:
    """TRL's calling convention: it names ``completions`` / ``prompts`` / ``completion_ids``, or takes
    keywords only (rlvr's form takes ``messages, answer`` positionally)."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return False
    names = {p.name for p in params}
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    return bool(names & set(TRL_PARAMETERS)) or (not positional and any(p.kind is p.VAR_KEYWORD for p in params))


def reward_entries(reward: Any) -> tuple[dict[str, Any], list[str]]:
    """``reward=`` as the objects to register (wanted name → object) and the spec of each reward, in
    order; a spec naming an object holds ``{name}`` (:func:`fill` puts its ``session:`` spec there)."""
    items = list(reward) if isinstance(reward, (list, tuple)) else [reward]
    if not items:
        raise ConfigError("reward= is empty; give a reward function (or several, in a list)")
    objects: dict[str, Any] = {}
    specs: list[str] = []
    for item in items:
        if isinstance(item, str):
            specs.append(item)
            continue
        if not callable(item) and not hasattr(item, "reward_fn"):
            raise ConfigError(f"reward= takes functions, environment objects or spec strings, got "
                              f"{type(item).__name__}")
        stem = name = name_of(item, "reward").strip("<>") or "reward"
        n = 1
        while name in objects:  # two functions of one name (two lambdas) stay two rewards
            n += 1
            name = f"{stem}_{n}"
        objects[name] = item
        trl = not hasattr(item, "reward_fn") and is_trl_reward(item)
        specs.append(("{" + name + "}") if not trl else TRL_PREFIX + "{" + name + "}")
    return objects, specs


def task_section(specs: list[str]) -> dict[str, Any]:
    """One reward that is no TRL function is ``task.env`` (an environment may be multi-turn); otherwise
    ``task.rewards``, summed with ``task.reward_weights``."""
    if len(specs) == 1 and not specs[0].startswith(TRL_PREFIX):
        return {"env": specs[0]}
    return {"rewards": specs}


def fill(spec: str, registered: Mapping[str, str]) -> str:
    """``spec`` with each ``{name}`` replaced by the ``session:`` spec ``name`` was registered under."""
    for name, session_spec in registered.items():
        spec = spec.replace("{" + name + "}", session_spec)
    return spec
