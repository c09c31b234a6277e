"""Worker threads that run torch end before the interpreter does.

CPython before 3.14 ends a daemon thread that takes the GIL back while the interpreter finalizes with
``pthread_exit``; its forced unwinding through torch's C++ frames (noexcept destructors) calls
``std::terminate``: "terminate called without an active exception", SIGABRT, exit status 134, a
dead notebook kernel if it happens there. A generation worker still inside a forward pass when the
main thread ends (a run that failed while its engine was generating, an engine nobody closed) does
exactly that, and the error the run ended with is lost behind the abort.

:func:`hold_exit` registers such a worker. At exit (``atexit`` runs before finalization starts) every
registered thread still alive is asked to stop and waited for: its forward pass ends, the worker sees
the stop (the in-process engine checks once a token) and returns, and the process exits with its own
status. A worker that does not stop within ``EXIT_WAIT_S`` is hung, not slow: the process then ends
at once with status 1 rather than abort. A line on stderr says what the exit waits for when it takes
more than a few seconds.
"""

from __future__ import annotations

import atexit
import os
import sys
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

EXIT_WAIT_S = 600.0  # a forward pass on a loaded CPU is long; a worker past this is hung
QUIET_S = 3.0  # waits shorter than this say nothing

_lock = threading.Lock()
_held: list[tuple[threading.Thread, weakref.ref, Callable[[Any], None]]] = []


def hold_exit(owner: Any, thread: threading.Thread, stop: Callable[[Any], None]) -> None:
    """Make the interpreter's exit wait for ``thread`` (``owner``'s worker); ``stop(owner)`` asks it to
    end without waiting (``owner`` is held weakly: a collected owner's thread is still waited for)."""
    with _lock:
        _held[:] = [entry for entry in _held if entry[0].is_alive()]
        _held.append((thread, weakref.ref(owner), stop))


def wait_for_workers(limit_s: float = EXIT_WAIT_S) -> list[str]:
    """Stop every held worker still running and wait for each; the names of any still alive after
    ``limit_s`` (the atexit hook exits at once, with status 1, if there are any)."""
    with _lock:
        alive = [entry for entry in _held if entry[0].is_alive()]
    for _thread, ref, stop in alive:
        owner = ref()
        if owner is not None:
            try:
                stop(owner)
            except Exception:  # noqa: BLE001, S110 - at exit, the wait below is what matters
                pass
    deadline = time.monotonic() + limit_s
    told = False
    for thread, _ref, _stop in alive:
        thread.join(timeout=max(0.0, min(QUIET_S, deadline - time.monotonic())))
        if thread.is_alive() and not told:
            told = True
            print(f"rlvr: waiting for {thread.name} to end its forward pass before exiting", file=sys.stderr,
                  flush=True)
        thread.join(timeout=max(0.0, deadline - time.monotonic()))
    return [thread.name for thread, _ref, _stop in alive if thread.is_alive()]


def _at_exit() -> None:
    hung = wait_for_workers()
    if hung:
        print(f"rlvr: {', '.join(hung)} did not stop within {EXIT_WAIT_S:g}s; exiting without it (status 1)",
              file=sys.stderr, flush=True)
        sys.stdout.flush()
        os._exit(1)  # finalizing under a running worker would abort the process instead


atexit.register(_at_exit)
