"""A rollout worker's core, whatever carries its calls (HTTP: :mod:`.app`; Ray:
:mod:`rlvr.backends.cluster.ray_rollouts`).

It holds **setups**: a setup is ``{"factory": SPEC, "kwargs": {...}}``, a ``make_rollout_fn``-style
factory (an import path ``package.module:attr`` or a file ``path/file.py:attr``) and the plain
values it is called with; the factory returns the run's rollout function (for ``rlvr train``:
:func:`rlvr.backends.rollout.setup.served_rollout_fn`). A setup is named by the hash of its content,
so the trainer may send it again at any time (after the worker restarted, it must) and a worker can
serve several runs or environments at once. It runs **rows**: a wire-encoded
:class:`~rlvr.rollouts.remote.RowJob` goes through
:func:`~rlvr.rollouts.episodes.group_from_rollout_fn`, exactly as in the training process (each
sample bounded by the row's ``sample_timeout_s``, ``SystemExit`` in user code an abort), with the
row's policy servers set for its samples (:data:`~rlvr.backends.rollout.served.SERVERS`); each
outcome goes back wire-encoded (:mod:`rlvr.rollouts.wire`).

With ``allowed_dirs`` set (the HTTP worker: a client is not trusted with the machine's files), a
setup in which any string names an existing file or folder outside those folders is refused. With
``allow_modules`` set too (the HTTP worker), the setup's factory must be a file inside those folders
or in one of those modules (a module or a package and what is under it), checked before anything is
imported or called (403, naming ``--allow-module``); and while the setup is built and its rows run,
every module or file an environment, reward or rollout spec names is checked the same way
(:func:`rlvr.envs.loading.checked_imports`), so a setup cannot reach other installed modules through
an allowed factory. Unset (a Ray actor: a trusted cluster), anything goes.

A backend module: imports the environments' loader.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from rlvr.backends.rollout.served import SERVERS
from rlvr.envs.import_check import checked_imports
from rlvr.envs.loading import load_object, spec_location
from rlvr.errors import ConfigError, RequestError, UnknownSetupError
from rlvr.protocols import RolloutFn
from rlvr.rollouts.episodes import group_from_rollout_fn
from rlvr.rollouts.wire import job_from_wire, outcome_to_wire


def setup_id(spec: dict[str, Any]) -> str:
    return hashlib.blake2b(json.dumps(spec, sort_keys=True, default=str).encode(), digest_size=12).hexdigest()


class WorkerCore:
    """Setups by id and the rows run with them; see the module docstring."""

    def __init__(self, allowed_dirs: Sequence[str] | None = None, allow_modules: Sequence[str] | None = None):
        self.allowed_dirs = None if allowed_dirs is None else [os.path.realpath(d) for d in allowed_dirs]
        self.allow_modules = None if allow_modules is None else tuple(allow_modules)
        self.fns: dict[str, RolloutFn] = {}
        self.rows = 0

    def setup(self, spec: dict[str, Any]) -> str:
        """Build (once) the rollout function ``spec`` describes; its id."""
        if not isinstance(spec, dict) or not isinstance(spec.get("factory"), str) or \
                not isinstance(spec.get("kwargs", {}), dict):
            raise RequestError("a setup is {\"factory\": \"module:attr\", \"kwargs\": {...}}", "factory")
        sid = setup_id(spec)
        if sid not in self.fns:
            self._check_paths(spec)
            location, _, is_file = spec_location(spec["factory"])
            self._check_import(location, is_file, "factory")
            refused: list[RequestError] = []
            with checked_imports(lambda where, file: self._check_import(where, file, "kwargs", refused)):
                try:
                    factory = load_object(spec["factory"])
                except ConfigError as exc:
                    raise RequestError(f"setup factory {spec['factory']!r}: {exc}", "factory") from None
                try:
                    fn = factory(**spec.get("kwargs", {}))
                except Exception:
                    if refused:  # the refusal, however the factory wrapped it
                        raise refused[0] from None
                    raise
            if not callable(fn):
                raise RequestError(f"setup factory {spec['factory']!r} returned {type(fn).__name__}, not a rollout "
                                   "function", "factory")
            self.fns[sid] = fn
        return sid

    async def run(self, sid: str, job: dict[str, Any]) -> list[dict[str, Any]]:
        """One row with setup ``sid``: its outcomes, wire-encoded."""
        fn = self.fns.get(sid)
        if fn is None:
            raise UnknownSetupError(sid)
        row = job_from_wire(job)
        token = SERVERS.set(row.servers)
        try:
            with checked_imports(lambda where, file: self._check_import(where, file, "job")):
                group = group_from_rollout_fn(fn, row.sample_timeout_s)
                outcomes = await group(row.task, len(row.seeds), row.version, lambda i: row.seeds[i])
        finally:
            SERVERS.reset(token)
        self.rows += 1
        return [outcome_to_wire(o) for o in outcomes]

    def _check_import(self, location: str, is_file: bool, param: str,
                      refused: list[RequestError] | None = None) -> None:
        """Refuse (403) a module outside ``allow_modules`` or a file outside ``allowed_dirs``."""
        if self.allow_modules is None:
            return
        if is_file:
            path = os.path.realpath(Path(location).expanduser())  # as the loader resolves it
            if self._inside(path):
                return
            what = f"the file {location!r} is outside the folders this worker may load code from (--allowed-dir: " \
                   f"{self.allowed_dirs or 'none'})"
        else:
            if any(location == m or location.startswith(m + ".") for m in self.allow_modules):
                return
            what = f"the module {location!r} is not one this worker may import (--allow-module: " \
                   f"{', '.join(self.allow_modules) or 'none'})"
        exc = RequestError(f"the setup names code this worker does not run: {what}", param, 403)
        if refused is not None:
            refused.append(exc)
        raise exc

    def _inside(self, path: str) -> bool:
        return any(path == d or path.startswith(d.rstrip(os.sep) + os.sep) for d in self.allowed_dirs or ())

    def _check_paths(self, spec: dict[str, Any]) -> None:
        if self.allowed_dirs is None:
            return
        for text in _strings(spec):
            path = os.path.realpath(os.path.expanduser(_file_part(text)))
            if (os.sep in text or text.startswith(("~", "."))) and os.path.exists(path) and not self._inside(path):
                raise RequestError(f"the setup names {text!r}, outside the folders this worker may read "
                                   f"(--allowed-dir: {self.allowed_dirs or 'none'})", "kwargs", 403)


def _file_part(text: str) -> str:
    """``path/file.py`` of a ``path/file.py:attr`` spec; the text itself otherwise."""
    head, sep, tail = text.rpartition(":")
    return head if sep and head.endswith(".py") and tail.isidentifier() else text


def _strings(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for v in value.values():
            yield from _strings(v)
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from _strings(v)
