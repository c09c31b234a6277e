"""Custom policy losses: a user function named by an import spec, loaded once and checked.

A custom loss is named ``package.module:function`` or ``path/to/file.py:function`` and loaded with
:func:`rlvr.envs.loading.load_object`, like every other user hook. It has the signature of the
``POLICY_LOSSES`` registry entries::

    fn(logp, old_logp, adv, mask, **params) -> (loss_tokens, diagnostics)

``logp`` (with grad), ``old_logp`` (detached) and ``adv`` are the [B,T] streams of
:mod:`~rlvr.backends.train.losses.policy`, already 0 outside ``mask`` (the boolean [B,T]
membership of the rl tokens). ``params`` is ``LossConfig.policy_loss_params()`` — the variant
fields, always None for a custom loss because setting one is refused — plus the entries of
``LossConfig.policy_loss_kwargs``; accept ``**params`` to ignore the ones not needed. It returns
the per-token loss L [B,T] (the quantity minimised, aggregated later) and a dict of [B,T]
diagnostics, each reported as ``train/<key>``, its mean over rl tokens.

Invariants: a spec is resolved once, when the ``LossConfig`` is built; a spec that does not
import, is not callable or cannot take those arguments fails then, not at the first step; every
call's result is checked for type and shape. Imports torch and :mod:`rlvr.envs.loading`.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from torch import Tensor

from rlvr.backends.train.losses.policy import POLICY_LOSSES, Diagnostics, PolicyLossFn
from rlvr.envs.loading import load_object
from rlvr.errors import ConfigError

Scalar = bool | int | float | str
SPEC_FORMS = "'package.module:function' or 'path/file.py:function'"


def is_custom(policy_loss: str) -> bool:
    """Whether ``policy_loss`` names a custom loss (an import spec) rather than a built-in."""
    return policy_loss not in POLICY_LOSSES


def checked_kwargs(kwargs: Mapping[str, Any], reserved: frozenset[str]) -> Mapping[str, Scalar]:
    """``kwargs`` as a read-only mapping, refusing names that are not identifiers, that clash with
    the ``reserved`` parameter names, or values that are not scalars (bool, int, float, str)."""
    if not isinstance(kwargs, Mapping):
        raise ValueError(f"is a {type(kwargs).__name__}; give a table of keyword arguments")
    for key, value in kwargs.items():
        if not isinstance(key, str) or not key.isidentifier():
            raise ValueError(f"key {key!r} is not a Python identifier, so it cannot be a keyword argument")
        if key in reserved:
            raise ValueError(f"key {key!r} is already passed to every policy loss (one of {sorted(reserved)}); "
                             "pick another name")
        if not isinstance(value, Scalar):
            raise ValueError(f"{key}={value!r} is a {type(value).__name__}; values must be scalars "
                             "(bool, int, float or str)")
    return MappingProxyType(dict(kwargs))


def load_policy_loss(spec: str, param_names: frozenset[str], extra: Mapping[str, Scalar]) -> PolicyLossFn:
    """The custom loss ``spec`` names, wrapped to add ``extra`` and to check what it returns.

    ``param_names`` are the ``**params`` every call passes (the keys of
    ``LossConfig.policy_loss_params()``), ``extra`` the ``policy_loss_kwargs``; the function must
    accept both. The wrapper has the registry entries' signature. Raises ``ValueError`` saying what
    is wrong with the spec.
    """
    base, sep, attr = spec.rpartition(":")
    if not (sep and base.strip() and attr.strip()):
        raise ValueError(f"{spec!r} is not one of {sorted(POLICY_LOSSES)} nor a custom loss {SPEC_FORMS}")
    try:
        fn = load_object(spec)
    except ConfigError as exc:
        # load_object words its messages for environments; keep only what went wrong.
        raise ValueError(f"{spec!r} does not load: {str(exc).removeprefix(f'environment {spec.strip()!r}: ')}") \
            from None
    if not callable(fn):
        raise ValueError(f"{spec!r} is a {type(fn).__name__}, not a function "
                         "fn(logp, old_logp, adv, mask, **params) -> (loss_tokens, diagnostics)")
    _check_signature(fn, spec, {**dict.fromkeys(param_names), **extra})
    return _checked(fn, spec, dict(extra))


def _check_signature(fn: Any, spec: str, params: Mapping[str, Any]) -> None:
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):
        return  # builtins and some C callables: nothing to check, the first call will tell
    try:
        signature.bind(None, None, None, None, **params)
    except TypeError as exc:
        raise ValueError(f"{spec!r} cannot be called as fn(logp, old_logp, adv, mask, **params) with params "
                         f"{sorted(params)} ({exc}); its signature is {signature}; accept **params") from None


def _checked(fn: Any, spec: str, extra: dict[str, Scalar]) -> PolicyLossFn:
    def custom_policy_loss(logp: Tensor, old_logp: Tensor, adv: Tensor, mask: Tensor,
                           **params: Any) -> tuple[Tensor, Diagnostics]:
        return _result(fn(logp, old_logp, adv, mask, **params, **extra), spec, tuple(logp.shape))

    custom_policy_loss.__wrapped__ = fn  # type: ignore[attr-defined]
    return custom_policy_loss


def _result(out: Any, spec: str, shape: tuple[int, ...]) -> tuple[Tensor, Diagnostics]:
    """``out`` if it is ``(loss_tokens, diagnostics)`` of [B,T] tensors, else a TypeError/ValueError."""
    what = f"custom policy loss {spec!r}"
    if not isinstance(out, tuple) or len(out) != 2:
        raise TypeError(f"{what} returned a {type(out).__name__}; return (loss_tokens, diagnostics)")
    tokens, diag = out
    if not isinstance(tokens, Tensor) or tuple(tokens.shape) != shape:
        got = tuple(tokens.shape) if isinstance(tokens, Tensor) else type(tokens).__name__
        raise ValueError(f"{what} returned loss_tokens {got}; expected a [B,T] tensor of shape {shape}")
    if not isinstance(diag, Mapping):
        raise TypeError(f"{what} returned diagnostics of type {type(diag).__name__}; return a dict (may be empty)")
    for key, value in diag.items():
        if not isinstance(key, str) or not isinstance(value, Tensor) or tuple(value.shape) != shape:
            got = tuple(value.shape) if isinstance(value, Tensor) else type(value).__name__
            raise ValueError(f"{what} returned diagnostic {key!r}: {got}; expected a [B,T] tensor of shape {shape}")
    return tokens, dict(diag)
