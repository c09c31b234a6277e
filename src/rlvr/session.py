"""Objects of this Python process that a run config names: in-memory rows and callables.

A run config names everything by text (a data file, ``package.module:fn``, ``path/env.py:fn``), so it
can be saved, hashed and rebuilt by ``rlvr resume``. ``rlvr.train(data=rows, reward=fn)`` gives such
objects names of their own, ``session:NAME``, registered here while the run is built and run; every
reader of a spec (:func:`rlvr.data.readers.read_tasks`, :func:`rlvr.envs.loading.load_object`) asks
here first, so in-memory rows and functions go through exactly the path files and import paths take.

Invariants: a name is registered to one object at a time (a second object under a taken name gets a
suffix, ``reward~2``); a spec whose object is gone fails naming what to do, never silently; nothing
here outlives :func:`registered` unless the caller keeps it. Standard library only.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from rlvr.errors import ConfigError

__all__ = ["PREFIX", "is_session_spec", "lookup", "registered"]

PREFIX = "session:"

_lock = threading.Lock()
_objects: dict[str, Any] = {}


def is_session_spec(spec: Any) -> bool:
    return isinstance(spec, str) and spec.startswith(PREFIX)


def lookup(spec: str) -> Any:
    """The object ``spec`` (``session:NAME``) names; a :class:`ConfigError` once it is gone (a saved
    config read by another process, or after the run that registered it)."""
    with _lock:
        if spec in _objects:
            return _objects[spec]
    raise ConfigError(f"{spec!r} names an object (rows or a function) of the Python session that started the run, "
                      "and this process does not have it; run it from Python again: rlvr.train(..., out=RUN_DIR, "
                      "resume=True) with the same data and rewards, or save the rows to a file and put the "
                      "function in a .py file the config can name")


@contextmanager
def registered(objects: Mapping[str, Any]) -> Iterator[dict[str, str]]:
    """Register ``objects`` (wanted name → object) for the block; yields wanted name → spec. A name in use
    by another object gets a suffix; the same object under the same name keeps its spec."""
    specs: dict[str, str] = {}
    added: list[str] = []
    with _lock:
        for wanted, obj in objects.items():
            stem = PREFIX + (re.sub(r"[^A-Za-z0-9_.-]", "_", wanted) or "object")
            spec, n = stem, 1
            while spec in _objects and _objects[spec] is not obj:
                n += 1
                spec = f"{stem}~{n}"
            if spec not in _objects:
                _objects[spec] = obj
                added.append(spec)
            specs[wanted] = spec
    try:
        yield specs
    finally:
        with _lock:
            for spec in added:
                _objects.pop(spec, None)
