"""Loading an environment: from a spec (import path, file, object) to a :class:`~rlvr.protocols.LoadedEnv`.

An **environment** is anything with ``reward_fn(messages, answer)`` (or ``(messages, answer, info)``,
or ``(messages, answer, **row)``: what it may take and return, and how that is read, is
:mod:`rlvr.reward`). It may also define ``interact(messages, state) ->
list[message]`` (or ``interact(messages)``) to be multi-turn: after each model turn the loop calls
it and appends what it returns; an empty list ends the conversation. ``state`` is a dict the loop
creates per rollout with :func:`~rlvr.rollouts.episodes.new_state` (keys ``answer``, ``info``,
``turn``); the environment may keep its own keys in it. Before each call the loop sets
``state["turn"]`` to the number of model turns so far (1 on the first call).

:func:`load_environment` normalises an environment once, at load: the reward function's arity is
checked, a one-parameter ``interact`` is wrapped, and every ``interact`` return is checked to be a
list of messages. Errors are :class:`~rlvr.errors.ConfigError` naming the spec.

Within :func:`checked_imports` (a rollout worker building a client's setup), every import path or
file a spec names is shown to a check before anything is imported: :func:`spec_location` is how
both read a spec, so what is checked is what would be imported.
Standard library only.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import inspect
import os
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from rlvr.envs.import_check import check_import, checked_imports
from rlvr.errors import ConfigError, EnvError, MissingExtraError, exception_text, safe_repr
from rlvr.protocols import InteractFn, LoadedEnv
from rlvr.reward import label_of, name_of
from rlvr.session import PREFIX, is_session_spec, lookup
from rlvr.types import Message

__all__ = ["check_import", "check_reward_signature", "checked_imports", "load_environment", "load_object",
           "spec_location"]

def load_environment(spec: Any, **kwargs: Any) -> LoadedEnv:
    """Load and normalise an environment.

    ``spec`` is one of:

    - an import path ``"package.module"`` or ``"package.module:attr"`` (``attr`` may be dotted);
    - a file path ``"path/to/env.py"`` or ``"path/to/env.py:attr"`` (executed as a fresh module
      each call; its folder is appended to ``sys.path``, so it imports the modules beside it as a
      script does);
    - an object: a module, a class, an instance with ``reward_fn``, a ``LoadedEnv``, or a bare
      callable, which is taken as the reward function.

    What the spec names is then built: a class is instantiated with ``kwargs``; a function named
    ``load_environment`` (or a module that defines one) is called with ``kwargs`` and its result
    normalised. Otherwise ``kwargs`` must be empty. Errors are :class:`ConfigError` naming the spec
    and what is missing; a missing optional package stays a :class:`MissingExtraError`.
    """
    if isinstance(spec, LoadedEnv):
        if kwargs:
            raise ConfigError(f"environment {spec.name!r} is already built; it takes no keyword arguments "
                              f"(got {sorted(kwargs)})")
        return spec
    if isinstance(spec, (str, os.PathLike)):
        label = os.fspath(spec)
        target, where = _resolve(label)
        env = _build(target, kwargs, where, factory_allowed=True)
        return _with_spec(env, label)
    return _build(spec, kwargs, label_of(spec), factory_allowed=True)


def load_object(spec: str) -> Any:
    """The object an import path (``package.module[:attr]``) or file (``path/to/file.py[:attr]``) names."""
    return _resolve(spec)[0]


def _with_spec(env: LoadedEnv, spec: str) -> LoadedEnv:
    return LoadedEnv(env.name, env.reward_fn, env.interact, env.make_rows, spec, env.source)


def spec_location(text: str) -> tuple[str, str | None, bool]:
    """What a spec names, as the loader reads it: ``(location, attr or None, whether location is a file)``."""
    text = text.strip()
    base, sep, attr = text.rpartition(":")
    if sep and base and attr and all(part.isidentifier() for part in attr.split(".")):
        location, attr_name = base, attr
    else:
        location, attr_name = text, None
    is_file = location.endswith(".py") or "/" in location or os.sep in location or Path(location).is_file()
    return location, attr_name, is_file


def _resolve(text: str) -> tuple[Any, str]:
    """The object an import/file spec names, and how to name it in messages."""
    text = text.strip()
    if not text:
        raise ConfigError("environment spec is empty; give 'package.module[:attr]' or 'path/to/env.py[:attr]'")
    if is_session_spec(text):  # an object of this process (rlvr.train(reward=fn)): see rlvr.session
        return lookup(text), text.removeprefix(PREFIX)
    location, attr_name, is_file = spec_location(text)
    if is_file:
        check_import(location, True)
        module, where = _import_file(location, text), Path(location).name
    else:
        if not all(part.isidentifier() for part in location.split(".")):
            raise ConfigError(f"environment {text!r}: {location!r} is neither an import path "
                              f"('package.module[:attr]') nor a file ('path/to/env.py[:attr]')")
        check_import(location)
        module, where = _import_module(location, text), location
    if attr_name is None:
        return module, where
    obj: Any = module
    for part in attr_name.split("."):
        if not hasattr(obj, part):
            raise ConfigError(f"environment {text!r}: {where} defines no {attr_name!r}")
        obj = getattr(obj, part)
    return obj, f"{where}:{attr_name}"


def _import_module(name: str, text: str) -> Any:
    try:
        return importlib.import_module(name)
    except MissingExtraError:
        raise
    except ModuleNotFoundError as exc:
        missing = exc.name or ""
        if missing and (name == missing or name.startswith(missing + ".")):
            raise ConfigError(f"environment {text!r}: no module named {missing!r}; give an importable "
                              f"'package.module[:attr]' or a file 'path/to/env.py[:attr]'") from exc
        raise ConfigError(f"environment {text!r}: importing {name} failed: {exception_text(exc)}") from exc
    except Exception as exc:
        raise ConfigError(f"environment {text!r}: importing {name} raised {exception_text(exc)}") from exc


def _import_file(location: str, text: str) -> Any:
    path = Path(location).expanduser()
    if not path.is_file():
        raise ConfigError(f"environment {text!r}: no such file {path.resolve()}")
    resolved = path.resolve()
    digest = hashlib.blake2b(str(resolved).encode(), digest_size=4).hexdigest()
    stem = "".join(ch if ch.isalnum() else "_" for ch in resolved.stem)
    module_name = f"rlvr_user_env_{stem}_{digest}"
    module_spec = importlib.util.spec_from_file_location(module_name, resolved)
    if module_spec is None or module_spec.loader is None:
        raise ConfigError(f"environment {text!r}: {resolved} cannot be loaded as a Python module")
    module = importlib.util.module_from_spec(module_spec)
    # Registered before executing: dataclasses and pickling look the module up by name.
    sys.modules[module_name] = module
    # Its folder is importable, as a script's is: a reward file imports a module beside it without
    # PYTHONPATH. Appended, not put first: a file there named like an installed package never shadows it.
    if str(resolved.parent) not in sys.path:
        sys.path.append(str(resolved.parent))
    try:
        module_spec.loader.exec_module(module)
    except MissingExtraError:
        sys.modules.pop(module_name, None)
        raise
    except BaseException as exc:
        sys.modules.pop(module_name, None)
        if not isinstance(exc, Exception):
            raise
        raise ConfigError(f"environment {text!r}: loading {resolved.name} raised {exception_text(exc)}") from exc
    return module


def _build(obj: Any, kwargs: dict[str, Any], where: str, *, factory_allowed: bool) -> LoadedEnv:
    if _is_verifiers_env(obj):  # a verifiers environment, as its load_environment returns it
        from rlvr.envs.graders.verifiers_adapter import from_verifiers

        _no_kwargs(kwargs, where, "an already built verifiers environment")
        obj = from_verifiers(obj)
    if isinstance(obj, LoadedEnv):
        _no_kwargs(kwargs, where, "an already built environment")
        return obj
    if inspect.ismodule(obj):
        factory = getattr(obj, "load_environment", None)
        if factory is load_environment:  # a module that merely imported this function
            factory = None
        if factory_allowed and callable(factory):
            built = _call_factory(factory, kwargs, where)
            return _build(built, {}, where, factory_allowed=False)
        _no_kwargs(kwargs, where, "a module without a load_environment factory")
        return _from_object(obj, where)
    if inspect.isclass(obj):
        if not factory_allowed:
            raise ConfigError(f"environment {where}: load_environment returned the class {obj.__qualname__}; "
                              "return an instance")
        return _build(_call_factory(obj, kwargs, where), {}, where, factory_allowed=False)
    if (factory_allowed and callable(obj) and not hasattr(obj, "reward_fn")
            and getattr(obj, "__name__", None) == "load_environment"):
        return _build(_call_factory(obj, kwargs, where), {}, where, factory_allowed=False)
    _no_kwargs(kwargs, where, "an environment object or reward function")
    if hasattr(obj, "reward_fn"):
        return _from_object(obj, where)
    if callable(obj):
        check_reward_signature(obj, f"environment {where}: the reward function")
        return LoadedEnv(name=name_of(obj, where), reward_fn=obj, source=obj)
    raise ConfigError(f"environment {where}: a {type(obj).__name__} is not an environment; it has no "
                      "reward_fn and is not callable")


def _is_verifiers_env(obj: Any) -> bool:
    # By its classes' modules, so that verifiers is never imported just to ask.
    return (not inspect.isclass(obj) and not hasattr(obj, "reward_fn") and hasattr(obj, "rubric")
            and any(k.__module__.split(".")[0] == "verifiers" for k in type(obj).__mro__))


def _no_kwargs(kwargs: dict[str, Any], where: str, what: str) -> None:
    if kwargs:
        raise ConfigError(f"environment {where}: keyword arguments {sorted(kwargs)} were given but {what} "
                          "takes none (define a load_environment(**kwargs) factory or a class)")


def _call_factory(factory: Callable[..., Any], kwargs: dict[str, Any], where: str) -> Any:
    label = getattr(factory, "__qualname__", None) or type(factory).__name__
    try:
        signature = inspect.signature(factory)
    except (TypeError, ValueError):
        signature = None
    if signature is not None:
        try:
            signature.bind(**kwargs)
        except TypeError as exc:
            raise ConfigError(f"environment {where}: {label}{signature} does not accept {sorted(kwargs)}: "
                              f"{exc}") from None
    try:
        return factory(**kwargs)
    except MissingExtraError:
        raise
    except Exception as exc:
        raise ConfigError(f"environment {where}: {label}(**{kwargs!r}) raised {exception_text(exc)}") from exc


def _from_object(obj: Any, where: str) -> LoadedEnv:
    reward_fn = getattr(obj, "reward_fn", None)
    if reward_fn is None:
        raise ConfigError(f"environment {where} defines no reward_fn (and no load_environment factory); "
                          "define reward_fn(messages, answer) -> float | Score | None")
    if not callable(reward_fn):
        raise ConfigError(f"environment {where}: reward_fn is a {type(reward_fn).__name__}, not a function")
    check_reward_signature(reward_fn, f"environment {where}: reward_fn")
    name = name_of(obj, where)
    interact = getattr(obj, "interact", None)
    if interact is not None:
        interact = _normalise_interact(interact, name, where)
    make_rows = getattr(obj, "make_rows", None)
    return LoadedEnv(name=name, reward_fn=reward_fn, interact=interact,
                     make_rows=make_rows if callable(make_rows) else None, source=obj)


TRL_PARAMETERS = ("completions", "prompts", "completion_ids")


def check_reward_signature(fn: Callable[..., Any], what: str) -> None:
    """Refuse, at load, a reward that cannot be called as ``reward_fn(messages, answer[, info])``,
    and a reward written for TRL (it names ``completions``): TRL calls rewards by keyword, a batch at
    a time, so such a function needs the ``trl:`` adapter (:mod:`rlvr.envs.trl`), not a guess."""
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):
        return  # builtins and some C callables: nothing to check, the first call will tell
    trl = [name for name in TRL_PARAMETERS if name in signature.parameters]
    if trl:
        raise ConfigError(f"{what} takes {trl[0]!r}: a TRL-style batch reward fn(completions, **kwargs) -> "
                          f"list; name it with the 'trl:' prefix (task.rewards = ['trl:file.py:fn']) so rlvr "
                          f"calls it as TRL does; its signature is {signature}")
    for n in (2, 3):
        try:
            signature.bind(*([None] * n))
            return
        except TypeError:
            continue
    raise ConfigError(f"{what} must be callable as reward_fn(messages, answer) or reward_fn(messages, answer, "
                      f"info); its signature is {signature}")


def _is_async(fn: Any) -> bool:
    call = None if inspect.isroutine(fn) else next(
        (k.__dict__["__call__"] for k in type(fn).__mro__ if "__call__" in k.__dict__), None)
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(call)


def _normalise_interact(fn: Any, name: str, where: str) -> InteractFn:
    """``interact`` as ``(messages, state) -> list[message]``, decided once by its signature."""
    if not callable(fn):
        raise ConfigError(f"environment {where}: interact is a {type(fn).__name__}, not a function")
    if _is_async(fn):
        raise ConfigError(f"environment {where}: interact is async; rlvr calls it synchronously, so define "
                          "a plain def interact(messages, state)")
    arity = 2
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):
        signature = None
    if signature is not None:
        try:
            signature.bind(None, None)
        except TypeError:
            try:
                signature.bind(None)
                arity = 1
            except TypeError:
                raise ConfigError(f"environment {where}: interact must accept (messages, state) or (messages); "
                                  f"its signature is {signature}") from None

    def interact(messages: list[Message], state: dict[str, Any]) -> list[Message]:
        out = fn(messages, state) if arity == 2 else fn(messages)
        return _check_turn(out, name)

    interact.__qualname__ = f"{name}.interact"
    interact.arity = arity  # type: ignore[attr-defined]
    return interact


def _check_turn(out: Any, name: str) -> list[Message]:
    if not isinstance(out, (list, tuple)):
        raise EnvError(f"interact of environment {name!r} returned {safe_repr(out)} "
                          f"({type(out).__name__}); return a list of messages, [] when the conversation is done")
    checked: list[Message] = []
    for i, message in enumerate(out):
        if not isinstance(message, Mapping) or not isinstance(message.get("role"), str) or "content" not in message:
            raise EnvError(f"interact of environment {name!r} returned item {i} = {safe_repr(message)}; "
                              "each must be a dict with a 'role' string and a 'content'")
        checked.append(dict(message))
    return checked





