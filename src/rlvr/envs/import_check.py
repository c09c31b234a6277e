"""The operator's check on what code a spec may import, open for a scope.

A rollout worker serving other machines' setups allows only the files and modules its operator named;
every module or file an environment, reward or rollout spec names is shown to that check before it is
imported (:func:`check_import`), wherever in rlvr the spec is read. Kept apart from
:mod:`rlvr.envs.loading` so that the adapters the loader imports lazily can call it without a circle.
Standard library only.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar

__all__ = ["check_import", "checked_imports"]

_IMPORT_CHECK: ContextVar[Callable[[str, bool], None] | None] = ContextVar("rlvr_import_check", default=None)


@contextmanager
def checked_imports(check: Callable[[str, bool], None]) -> Iterator[None]:
    """While open (in this context: its thread, and the tasks started in it), every module or file a
    spec names is passed to ``check(location, is_file)`` before it is imported; ``check`` raises to refuse."""
    token = _IMPORT_CHECK.set(check)
    try:
        yield
    finally:
        _IMPORT_CHECK.reset(token)


def check_import(location: str, is_file: bool = False) -> None:
    """Show ``location`` to the open :func:`checked_imports` check, if any (a no-op otherwise)."""
    check = _IMPORT_CHECK.get()
    if check is not None:
        check(location, is_file)
