"""The environment contract: what an environment is, how one is loaded, how its reward is read.

An **environment** is anything with ``reward_fn(messages, answer)``. ``messages`` is the whole
conversation (prompt and the model's turns, OpenAI-style dicts); ``answer`` is the row's answer.
A reward function returns one of:

- a ``float`` (an ``int`` or any real number but ``bool`` is accepted and converted);
- a :class:`Score`: named components, some paid (weight != 0), some only recorded (weight 0);
- ``None``: the reward does not apply to this rollout (the loop decides whether to drop it).

An environment may also define ``interact(messages, state) -> list[message]`` (or
``interact(messages)``) to be multi-turn: after each model turn the loop calls it and appends
what it returns; an empty list ends the conversation. ``state`` is a dict the loop creates per
rollout with :func:`new_state` (keys ``answer``, ``info``, ``turn``); the environment may keep its
own keys in it. Before each call the loop sets ``state["turn"]`` to the number of model turns so
far (1 on the first call).

:func:`load_environment` turns a spec (import path, file path or object) into a
:class:`LoadedEnv`; :func:`evaluate_reward` calls a reward function and converts what it returns,
raising :class:`~rlvr.errors.RewardError` (and nothing else) when that is not a reward. Whether a
bad reward fails the run or drops the rollout is the loop's decision, not this module's.

Standard library only.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import inspect
import math
import numbers
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from rlvr.errors import ConfigError, MissingExtraError, RewardError, RLLoopError
from rlvr.types import Message

__all__ = [
    "Environment", "LoadedEnv", "MultiTurnEnvironment", "RewardResult", "Score", "evaluate_reward",
    "load_environment", "load_object", "new_state",
]

InteractFn = Callable[[list[Message], dict[str, Any]], list[Message]]
_REPR_LIMIT = 200


# ----------------------------------------------------------------------------------------- Score


@dataclass(frozen=True, slots=True)
class Score:
    """A reward made of named components.

    ``value = sum(weights[k] * components[k])`` over the weighted components. A component without
    a weight has weight 0: it is a **metric only**, recorded but never paid. We chose 0 over 1 so
    that adding a diagnostic (a length, a ``parsed`` flag) can never silently change the reward;
    the opposite mistake (forgetting every weight) is caught instead: a Score needs at least one
    weight, and every weight must name a component, so a typo fails at construction.
    Components and weights are finite real numbers (``bool`` is refused: write 1.0/0.0).

    ``Score.of(1.0, parsed=1.0)`` is the common case: one paid ``reward`` component plus metrics.
    """

    components: dict[str, float]
    weights: dict[str, float]

    def __post_init__(self) -> None:
        components = _float_dict("components", self.components)
        weights = _float_dict("weights", self.weights)
        if not components:
            raise ValueError("Score needs at least one component")
        unknown = sorted(set(weights) - set(components))
        if unknown:
            raise ValueError(f"Score weights name no component: {unknown}; components are {sorted(components)}")
        if not weights:
            raise ValueError(
                f"Score has no weights, so its value would always be 0; give weights for the paid "
                f"components, e.g. weights={{{next(iter(components))!r}: 1.0}} (unweighted ones are metrics)"
            )
        object.__setattr__(self, "components", components)
        object.__setattr__(self, "weights", weights)

    @classmethod
    def of(cls, reward: float, /, **metrics: float) -> Score:
        """A Score paying ``reward`` (component ``"reward"``, weight 1) with metrics beside it."""
        if "reward" in metrics:
            raise ValueError("Score.of: 'reward' is the paid component; name the metric differently")
        return cls({"reward": reward, **metrics}, {"reward": 1.0})

    @property
    def value(self) -> float:
        """The paid reward: the weighted sum of the weighted components."""
        return math.fsum(w * self.components[k] for k, w in self.weights.items())

    @property
    def metrics(self) -> dict[str, float]:
        """Every component (paid or not), as recorded beside the reward."""
        return dict(self.components)


def _float_dict(what: str, values: Any) -> dict[str, float]:
    if not isinstance(values, Mapping):
        raise TypeError(f"Score {what} must be a dict of name -> float, got {type(values).__name__}")
    out: dict[str, float] = {}
    for key, value in values.items():
        if not isinstance(key, str) or not key:
            raise TypeError(f"Score {what} keys must be non-empty strings, got {_safe_repr(key)}")
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            raise TypeError(f"Score {what}[{key!r}] must be a real number (not bool), got {_safe_repr(value)}")
        number = float(value)
        if not math.isfinite(number):
            raise ValueError(f"Score {what}[{key!r}] must be finite, got {number}")
        out[key] = number
    return out


# ------------------------------------------------------------------------------------- Protocols


@runtime_checkable
class Environment(Protocol):
    """A single-turn environment: a reward function and nothing else required."""

    def reward_fn(self, messages: list[Message], answer: Any) -> float | Score | None: ...


@runtime_checkable
class MultiTurnEnvironment(Environment, Protocol):
    """An environment that answers the model: ``interact`` returns the next messages, ``[]`` = done.

    ``interact(messages)`` with one parameter is accepted too (see :func:`load_environment`).
    """

    def interact(self, messages: list[Message], state: dict[str, Any]) -> list[Message]: ...


def new_state(answer: Any, info: Mapping[str, Any] | None = None, *, turn: int = 0) -> dict[str, Any]:
    """The per-rollout state dict the loop creates before the first model turn."""
    return {"answer": answer, "info": dict(info or {}), "turn": turn}


# ------------------------------------------------------------------------------------- LoadedEnv


@dataclass(frozen=True, slots=True)
class LoadedEnv:
    """An environment, normalised.

    ``reward_fn(messages, answer)`` as the environment wrote it (its return is read by
    :func:`evaluate_reward`); ``interact(messages, state)`` always takes two arguments here (a
    one-parameter ``interact`` is wrapped at load) and checks that it returns a list of messages;
    ``make_rows`` is the environment's own row maker, when it has one.
    """

    name: str
    reward_fn: Callable[[list[Message], Any], Any]
    interact: InteractFn | None = None
    make_rows: Callable[..., list[dict[str, Any]]] | None = None
    spec: str | None = None
    source: Any = field(default=None, repr=False, compare=False)

    @property
    def multi_turn(self) -> bool:
        return self.interact is not None

    def describe(self) -> dict[str, Any]:
        """What the run record says about this environment."""
        return {"type": "environment", "name": self.name, "spec": self.spec, "multi_turn": self.multi_turn}


def load_environment(spec: Any, **kwargs: Any) -> LoadedEnv:
    """Load and normalise an environment.

    ``spec`` is one of:

    - an import path ``"package.module"`` or ``"package.module:attr"`` (``attr`` may be dotted);
    - a file path ``"path/to/env.py"`` or ``"path/to/env.py:attr"`` (executed as a fresh module
      each call; sibling imports need the folder on ``sys.path`` or an import path instead);
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
    return _build(spec, kwargs, _label_of(spec), factory_allowed=True)


def load_object(spec: str) -> Any:
    """The object an import path (``package.module[:attr]``) or file (``path/to/file.py[:attr]``) names."""
    return _resolve(spec)[0]


def _with_spec(env: LoadedEnv, spec: str) -> LoadedEnv:
    return LoadedEnv(env.name, env.reward_fn, env.interact, env.make_rows, spec, env.source)


def _resolve(text: str) -> tuple[Any, str]:
    """The object an import/file spec names, and how to name it in messages."""
    text = text.strip()
    if not text:
        raise ConfigError("environment spec is empty; give 'package.module[:attr]' or 'path/to/env.py[:attr]'")
    base, sep, attr = text.rpartition(":")
    if sep and base and attr and all(part.isidentifier() for part in attr.split(".")):
        location, attr_name = base, attr
    else:
        location, attr_name = text, None
    if location.endswith(".py") or "/" in location or os.sep in location or Path(location).is_file():
        module, where = _import_file(location, text), Path(location).name
    else:
        if not all(part.isidentifier() for part in location.split(".")):
            raise ConfigError(f"environment {text!r}: {location!r} is neither an import path "
                              f"('package.module[:attr]') nor a file ('path/to/env.py[:attr]')")
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
        raise ConfigError(f"environment {text!r}: importing {name} failed: {_exc_text(exc)}") from exc
    except Exception as exc:
        raise ConfigError(f"environment {text!r}: importing {name} raised {_exc_text(exc)}") from exc


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
    try:
        module_spec.loader.exec_module(module)
    except MissingExtraError:
        sys.modules.pop(module_name, None)
        raise
    except BaseException as exc:
        sys.modules.pop(module_name, None)
        if not isinstance(exc, Exception):
            raise
        raise ConfigError(f"environment {text!r}: loading {resolved.name} raised {_exc_text(exc)}") from exc
    return module


def _build(obj: Any, kwargs: dict[str, Any], where: str, *, factory_allowed: bool) -> LoadedEnv:
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
        _check_arity(obj, 2, f"environment {where}: the reward function", "reward_fn(messages, answer)")
        return LoadedEnv(name=_name_of(obj, where), reward_fn=obj, source=obj)
    raise ConfigError(f"environment {where}: a {type(obj).__name__} is not an environment; it has no "
                      "reward_fn and is not callable")


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
            raise ConfigError(f"environment {where}: {label}{signature} does not accept {sorted(kwargs)}: {exc}") from None
    try:
        return factory(**kwargs)
    except MissingExtraError:
        raise
    except Exception as exc:
        raise ConfigError(f"environment {where}: {label}(**{kwargs!r}) raised {_exc_text(exc)}") from exc


def _from_object(obj: Any, where: str) -> LoadedEnv:
    reward_fn = getattr(obj, "reward_fn", None)
    if reward_fn is None:
        raise ConfigError(f"environment {where} defines no reward_fn (and no load_environment factory); "
                          "define reward_fn(messages, answer) -> float | Score | None")
    if not callable(reward_fn):
        raise ConfigError(f"environment {where}: reward_fn is a {type(reward_fn).__name__}, not a function")
    _check_arity(reward_fn, 2, f"environment {where}: reward_fn", "reward_fn(messages, answer)")
    name = _name_of(obj, where)
    interact = getattr(obj, "interact", None)
    if interact is not None:
        interact = _normalise_interact(interact, name, where)
    make_rows = getattr(obj, "make_rows", None)
    return LoadedEnv(name=name, reward_fn=reward_fn, interact=interact,
                     make_rows=make_rows if callable(make_rows) else None, source=obj)


def _check_arity(fn: Callable[..., Any], n: int, what: str, form: str) -> None:
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):
        return  # builtins and some C callables: nothing to check, the first call will tell
    try:
        signature.bind(*([None] * n))
    except TypeError:
        raise ConfigError(f"{what} must be callable as {form}; its signature is {signature}") from None


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
        raise RLLoopError(f"interact of environment {name!r} returned {_safe_repr(out)} "
                          f"({type(out).__name__}); return a list of messages, [] when the conversation is done")
    checked: list[Message] = []
    for i, message in enumerate(out):
        if not isinstance(message, Mapping) or not isinstance(message.get("role"), str) or "content" not in message:
            raise RLLoopError(f"interact of environment {name!r} returned item {i} = {_safe_repr(message)}; "
                              "each must be a dict with a 'role' string and a 'content'")
        checked.append(dict(message))
    return checked


def _name_of(obj: Any, fallback: str) -> str:
    for attr in ("name", "NAME"):
        value = getattr(obj, attr, None)
        if isinstance(value, str) and value:
            return value
    if inspect.ismodule(obj):
        return obj.__name__.rpartition(".")[2]
    qualname = getattr(obj, "__qualname__", None)
    if isinstance(qualname, str) and not inspect.isclass(obj) and callable(obj) and inspect.isroutine(obj):
        return qualname.rpartition("<locals>.")[2]
    kind = type(obj).__name__
    return kind if kind not in ("function", "partial") else fallback


def _label_of(obj: Any) -> str:
    try:
        if inspect.ismodule(obj):
            return obj.__name__
        return getattr(obj, "__qualname__", None) or type(obj).__qualname__
    except Exception:  # noqa: BLE001 - any failure becomes a named error
        return "<environment>"


# -------------------------------------------------------------------------------- evaluate_reward


@dataclass(frozen=True, slots=True)
class RewardResult:
    """What one reward call gave: ``value`` (``None`` = does not apply) and its metrics."""

    value: float | None
    metrics: dict[str, float] = field(default_factory=dict)

    @property
    def applies(self) -> bool:
        return self.value is not None


def evaluate_reward(env: Any, messages: Sequence[Message], answer: Any) -> RewardResult:
    """Call ``env``'s reward function on one conversation and read what it returns.

    ``env`` is a :class:`LoadedEnv`, an object with ``reward_fn`` or a bare reward function.
    A float or int (not ``bool``) becomes the value; a :class:`Score` gives its value and its
    components as metrics; ``None`` gives ``RewardResult(None)``. Everything else (``bool``, NaN,
    infinities, strings, other objects) and every ``Exception`` the reward function raises becomes
    a :class:`RewardError` naming the environment and the value or exception; nothing else escapes
    (``KeyboardInterrupt`` and friends do propagate). This helper never decides to fail or drop.
    """
    name = _env_name(env)
    try:
        fn = env.reward_fn if isinstance(env, LoadedEnv) else getattr(env, "reward_fn", env)
    except Exception as exc:
        raise RewardError(f"environment {name}: reading reward_fn raised {_exc_text(exc)}") from exc
    if not callable(fn):
        raise RewardError(f"environment {name}: reward_fn is {_safe_repr(fn)}, not a function")
    try:
        out = fn(messages, answer)
    except Exception as exc:
        raise RewardError(f"reward_fn of {name} raised {_exc_text(exc)}") from exc
    try:
        return _read_reward(out, name)
    except RewardError:
        raise
    except Exception as exc:
        raise RewardError(f"reward_fn of {name} returned {_safe_repr(out)} ({_type_name(out)}), which could not "
                          f"be read as a reward: {_exc_text(exc)}") from exc


def _read_reward(out: Any, name: str) -> RewardResult:
    if out is None:
        return RewardResult(None, {})
    if isinstance(out, Score):
        value = out.value
        metrics = out.metrics
        if not math.isfinite(value):
            raise RewardError(f"reward_fn of {name} returned a Score whose value is {value} "
                              f"(components {metrics}, weights {dict(out.weights)}); expected a finite value")
        return RewardResult(value, metrics)
    if isinstance(out, bool):
        raise RewardError(f"reward_fn of {name} returned {out!r} (bool); return a float such as "
                          f"{float(out)} instead, so a predicate is never mistaken for a reward")
    if isinstance(out, numbers.Real):
        value = float(out)
        if not math.isfinite(value):
            raise RewardError(f"reward_fn of {name} returned {_safe_repr(out)} ({_type_name(out)}); "
                              "expected a finite float")
        return RewardResult(value, {})
    raise RewardError(f"reward_fn of {name} returned {_safe_repr(out)} ({_type_name(out)}); "
                      "expected a float, a Score or None")


def _env_name(env: Any) -> str:
    try:
        if isinstance(env, LoadedEnv):
            return repr(env.name)
        return repr(_name_of(env, _label_of(env)))
    except Exception:  # noqa: BLE001 - any failure becomes a named error
        return "<environment>"


def _type_name(value: Any) -> str:
    return type(value).__name__


def _safe_repr(value: Any, limit: int = _REPR_LIMIT) -> str:
    try:
        text = repr(value)
    except Exception:  # noqa: BLE001 - any failure becomes a named error
        text = f"<{type(value).__name__} object whose repr() raised>"
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _exc_text(exc: BaseException) -> str:
    try:
        message = str(exc)
    except Exception:  # noqa: BLE001 - any failure becomes a named error
        message = "<str() of the exception raised>"
    if len(message) > 2 * _REPR_LIMIT:
        message = message[: 2 * _REPR_LIMIT - 3] + "..."
    return f"{type(exc).__name__}: {message}" if message else type(exc).__name__
