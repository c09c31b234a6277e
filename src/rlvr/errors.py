"""One error hierarchy for rlvr.

Every class also subclasses the stdlib error it stands in for, so callers that catch
``ValueError`` or ``RuntimeError`` keep working. Messages name the field, row or request at
fault and say what to do.
"""

from __future__ import annotations


class RLVRError(Exception):
    """Base class of every error rlvr raises on purpose."""


class RLLoopError(RLVRError, RuntimeError):
    """A run was refused or could not continue (corpus too small, missing seam, bad state)."""


class ConfigError(RLLoopError, ValueError):
    """A configuration value is invalid; the message names the field."""


class DataError(RLVRError, ValueError):
    """A row of input data is malformed; the message names the source, row and field."""


class RewardError(RLLoopError):
    """A reward function raised or returned something that is not a reward; the message names the
    environment and the offending value or exception. The loop decides whether to fail or drop."""


class MissingExtraError(RLVRError, ImportError):
    """An optional dependency is missing; the message names the extra to install."""


class RecordError(RLVRError, ValueError):
    """A run record on disk is missing, incomplete or inconsistent."""


def require_extra(extra: str, *modules: str) -> None:
    """Import ``modules`` or raise :class:`MissingExtraError` naming ``rlvr[extra]``."""
    import importlib

    for name in modules:
        try:
            importlib.import_module(name)
        except ImportError as exc:
            raise MissingExtraError(
                f"this needs the '{name}' package: pip install 'rlvr[{extra}]' "
                f"(install torch first to pick the CPU or CUDA build you want)"
            ) from exc
