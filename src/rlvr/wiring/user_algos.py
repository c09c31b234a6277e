"""The user code ``[algo]`` names through ``import_path``: a ``custom`` credit function or
:class:`~rlvr.algos.Algorithm` subclass, and ``echo``'s token filter.

Each is loaded with :func:`~rlvr.envs.loading.load_object` (``package.module:name`` or
``path/file.py:name``) once, when the run is built; one that does not import, or is neither a
function nor an Algorithm subclass, fails there naming ``algo.import_path`` (or
``envs.NAME.algo.import_path``), before anything is written.
"""

from __future__ import annotations

from typing import Any

from rlvr.algos import Algorithm, Custom, Echo
from rlvr.algos.custom import user_algorithm
from rlvr.config.run import AlgoSection
from rlvr.envs.loading import load_object
from rlvr.errors import ConfigError


def loaded(algo: AlgoSection, where: str) -> Any:
    """What ``algo.import_path`` names, checked to be a function or (``custom`` only) an Algorithm subclass."""
    try:
        target = load_object(str(algo.import_path))
    except ConfigError as exc:
        raise ConfigError(f"{where}.import_path: {exc}") from None
    if algo.type == "custom" and isinstance(target, type) and issubclass(target, Algorithm):
        return target
    if isinstance(target, type) or not callable(target):
        wanted = "a credit function or an rlvr.algos.Algorithm subclass" if algo.type == "custom" else "a function"
        raise ConfigError(f"{where}.import_path={algo.import_path!r} names {target!r}, not {wanted}")
    return target


def custom_algorithm(algo: AlgoSection, where: str) -> Algorithm:
    """``type = 'custom'``: the user's Algorithm subclass built with ``kwargs``, or their credit function."""
    target = loaded(algo, where)
    if isinstance(target, type):
        return user_algorithm(target, str(algo.import_path), dict(algo.kwargs), where)
    return Custom(target, str(algo.import_path), dict(algo.kwargs))


def echo_algorithm(algo: AlgoSection, advantage: str, where: str) -> Echo:
    """``type = 'echo'``, with its token filter when ``import_path`` names one."""
    token_filter = loaded(algo, where) if algo.import_path is not None else None
    return Echo(advantage, algo.roles, token_filter, algo.import_path, dict(algo.kwargs))
