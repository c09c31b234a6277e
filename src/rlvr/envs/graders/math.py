"""Math answers checked by ``math-verify`` (the ``math`` extra), with a timeout that works anywhere.

``MathVerify(timeout=5.0).reward_fn(messages, answer)`` parses the last assistant message and
the gold answer(s) with ``math_verify.parse`` and compares them with ``math_verify.verify``
(``\\frac{2}{4}`` equals ``0.5``, ``\\boxed{}`` is found, sets and intervals compare as such).
The reward is a :class:`~rlvr.envs.loading.Score`: ``correct`` (weight 1), and the metrics
``parsed`` (an answer was found in the reply) and ``timeout`` (the check ran out of time; the
reward is then 0). When no gold answer can be parsed the reward does not apply: ``None``.

**Timeouts.** math-verify's own timeouts use ``signal.alarm``, which only works in the main
thread, and the loop may score rewards from any thread. So parse/verify run with their timeout
arguments disabled (``parsing_timeout=None``, ``timeout_seconds=None``) inside a worker, and the
caller bounds its wait on the worker instead.

The worker is a **process** by default (``isolation="process"``), not a thread pool: a sympy
computation that hangs cannot be interrupted in a thread (Python has no safe way to kill one), so
every timeout would leak a thread that keeps burning a core and competing for the GIL with the
rest of the run; a process is killed on timeout and a fresh one is started for the next call,
and sympy's caches and memory stay out of the trainer's process. The cost is one start per
worker (spawn + importing sympy, a second or two, not counted in the timeout) and about a
tenth of a millisecond of pipe traffic per call. Each worker is a fresh interpreter (safe after
torch/CUDA and threads have started, as ``spawn`` is) that never re-runs the user's ``__main__``,
so a plain script without ``if __name__ == "__main__":`` works. ``isolation="thread"`` (a daemon thread per call)
is there for platforms that cannot spawn processes and for tests; a timed-out thread is
abandoned, not stopped.

``math_verify`` is imported lazily: importing this module needs only the standard library;
building a :class:`MathVerify` without the package raises :class:`~rlvr.errors.MissingExtraError`
naming the ``math`` extra.
"""

from __future__ import annotations

import multiprocessing
import os
import queue
import re
import subprocess
import sys
import threading
import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal

from rlvr.envs.graders.exact_match import gold_answers
from rlvr.envs.parsing import last_assistant_text
from rlvr.errors import GradingTimeout, MissingExtraError, require_extra
from rlvr.reward import Score

NAME = "math"
EXTRA = "math"
WEIGHTS = {"correct": 1.0}
ISOLATIONS = ("process", "thread")


class MathVerify:
    """Reward 1 when ``math_verify`` finds the reply's answer equal to a gold answer.

    ``timeout``: seconds one check (parsing reply and golds, verifying) may take.
    ``isolation``: ``"process"`` (default) or ``"thread"``; see the module docs.
    ``workers``: how many checks may run at once (calls beyond that wait for a free worker;
    the wait is not part of the timeout). ``float_rounding``, ``numeric_precision`` and
    ``strict`` are passed to ``math_verify.verify``. ``start_timeout``: seconds a new worker
    process may take to start.
    """

    name = NAME

    def __init__(self, timeout: float = 5.0, *, isolation: Literal["process", "thread"] = "process",
                 workers: int = 1, float_rounding: int = 6, numeric_precision: int = 15, strict: bool = True,
                 start_timeout: float = 120.0) -> None:
        require_extra(EXTRA, "math_verify")
        _check_version()
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not 0 < timeout < float("inf"):
            raise ValueError(f"MathVerify: timeout must be a positive number of seconds, got {timeout!r}")
        if isolation not in ISOLATIONS:
            raise ValueError(f"MathVerify: isolation must be one of {ISOLATIONS}, got {isolation!r}")
        if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
            raise ValueError(f"MathVerify: workers must be an integer >= 1, got {workers!r}")
        self.timeout, self.isolation, self.workers = float(timeout), isolation, workers
        self.options = (int(float_rounding), int(numeric_precision), bool(strict))
        made: list[_ProcessWorker | _ThreadWorker] = [
            _ProcessWorker(check_answer, init=_warm_up, start_timeout=start_timeout) if isolation == "process"
            else _ThreadWorker(_check_answer_by_name)
            for _ in range(workers)
        ]
        self._idle: queue.Queue[_ProcessWorker | _ThreadWorker] = queue.Queue()
        for worker in made:
            self._idle.put(worker)
        self._finalizer = weakref.finalize(self, _close_all, made)

    def reward_fn(self, messages: Sequence[Mapping[str, Any]], answer: Any) -> Score | None:
        golds = tuple(gold_answers(answer, who="MathVerify"))
        reply = last_assistant_text(messages, who="MathVerify.reward_fn")
        try:
            status, correct = self._run((reply, golds, *self.options))
        except GradingTimeout:
            return Score({"correct": 0.0, "parsed": 0.0, "timeout": 1.0}, WEIGHTS)
        if status == "no_gold":
            return None
        if status == "unparsed":
            return Score({"correct": 0.0, "parsed": 0.0, "timeout": 0.0}, WEIGHTS)
        return Score({"correct": float(bool(correct)), "parsed": 1.0, "timeout": 0.0}, WEIGHTS)

    def _run(self, args: tuple[Any, ...]) -> tuple[str, Any]:
        worker = self._idle.get()
        try:
            return worker.call(args, self.timeout)
        finally:
            self._idle.put(worker)

    def close(self) -> None:
        """Stop the worker processes now (they are also stopped at garbage collection and exit)."""
        self._finalizer()

    def describe(self) -> dict[str, Any]:
        float_rounding, numeric_precision, strict = self.options
        return {"type": f"{__name__}.MathVerify", "timeout": self.timeout, "isolation": self.isolation,
                "workers": self.workers, "float_rounding": float_rounding,
                "numeric_precision": numeric_precision, "strict": strict}


MIN_VERSION = (0, 8)  # the first math-verify whose parse/verify accept a disabled (None) timeout


def _check_version() -> None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        found = version("math-verify")
    except PackageNotFoundError:  # a source checkout without metadata: trust it
        return
    parts = tuple(int(p) for p in re.findall(r"\d+", found)[:2])
    if parts < MIN_VERSION:
        raise MissingExtraError(f"math-verify {found} is too old (rlvr needs >= {'.'.join(map(str, MIN_VERSION))}, "
                                f"whose timeouts can be disabled): pip install 'rlvr[{EXTRA}]'")


def load_environment(**kwargs: Any) -> MathVerify:
    """The factory :func:`rlvr.envs.loading.load_environment` calls with its keyword arguments."""
    return MathVerify(**kwargs)


# ------------------------------------------------------------------------- what runs in a worker


def check_answer(reply: str, golds: Sequence[str], float_rounding: int = 6, numeric_precision: int = 15,
                 strict: bool = True) -> tuple[str, bool | None]:
    """``("ok", correct)``, ``("unparsed", None)`` or ``("no_gold", None)``; no timeouts inside.

    Gold answers are usually bare LaTeX (``x^2+1``, ``(1, 2)``), which math-verify reads best
    inside ``\\boxed{}``; golds that already carry ``$`` or ``\\boxed`` are parsed as they are.
    Golds that do not parse as math (no string fallback) are ignored; when none parses the
    result is ``no_gold``.
    """
    from math_verify import parse, verify

    parsed_golds = [p for p in (_parse_gold(parse, g) for g in golds) if p]
    if not parsed_golds:
        return "no_gold", None
    predicted = parse(reply, parsing_timeout=None)
    if not predicted:
        return "unparsed", None
    correct = any(verify(gold, predicted, float_rounding=float_rounding, numeric_precision=numeric_precision,
                         strict=strict, timeout_seconds=None) for gold in parsed_golds)
    return "ok", bool(correct)


def _parse_gold(parse: Callable[..., list[Any]], gold: str) -> list[Any]:
    # No string fallback for golds: a gold that math-verify cannot read as math is unparsable.
    options = {"parsing_timeout": None, "fallback_mode": "no_fallback"}
    if "$" in gold or "\\boxed" in gold or "\\(" in gold or "\\[" in gold:
        return parse(gold, **options)
    return parse(f"\\boxed{{{gold}}}", **options) or parse(gold, **options)


def _check_answer_by_name(*args: Any) -> tuple[str, bool | None]:
    # Looked up at call time so a patched module attribute (tests) takes effect in thread mode.
    return check_answer(*args)


def _warm_up() -> None:
    """Import math-verify and sympy and run one check, so the first timed call is not the slow one."""
    check_answer("\\boxed{1}", ("1",))


def _serve(conn: Any, target: Callable[..., Any], init: Callable[[], None] | None) -> None:
    """The worker process's main loop: receive argument tuples, send ``(status, value)`` back."""
    import logging

    logging.getLogger("math_verify").setLevel(logging.ERROR)  # "timeout is disabled" is on purpose
    try:
        if init is not None:
            init()
    except BaseException as exc:  # noqa: BLE001 - reported to the parent, which raises
        conn.send(("error", f"{type(exc).__name__}: {exc}"))
        return
    conn.send(("ready", None))
    while True:
        try:
            args = conn.recv()
        except (EOFError, OSError):
            return
        try:
            result: tuple[str, Any] = ("ok", target(*args))
        except Exception as exc:  # noqa: BLE001 - reported to the parent, which raises
            result = ("error", f"{type(exc).__name__}: {exc}")
        conn.send(result)


# ------------------------------------------------------------------------------------ the workers


class _ProcessWorker:
    """One long-lived worker process running ``target``; killed and replaced on timeout.

    The process is a fresh interpreter (``python -c``) that imports this module, not a
    ``multiprocessing`` spawn child: spawn re-runs the parent's ``__main__`` script in the child, so a
    plain script without ``if __name__ == "__main__":`` would start its whole run again there (and fail
    opaquely). ``target`` and ``init`` travel pickled over the pipe, so they must be importable."""

    def __init__(self, target: Callable[..., Any], *, init: Callable[[], None] | None = None,
                 start_timeout: float = 120.0) -> None:
        self._target, self._init, self._start_timeout = target, init, start_timeout
        self._proc: subprocess.Popen[bytes] | None = None
        self._conn: Any = None
        self._lock = threading.Lock()

    @property
    def alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def call(self, args: tuple[Any, ...], timeout: float) -> Any:
        with self._lock:
            if not self.alive:
                self._start()
            try:
                self._conn.send(args)
            except OSError:
                self._stop()
                raise RuntimeError("the math-verify worker process died before the call was sent") from None
            if not self._conn.poll(timeout):
                self._stop()
                raise GradingTimeout(f"no answer within {timeout}s; the worker process was killed")
            try:
                status, value = self._conn.recv()
            except (EOFError, OSError):
                code = self._proc.poll() if self._proc is not None else None
                self._stop()
                raise RuntimeError(f"the math-verify worker process died (exit code {code})") from None
            if status != "ok":
                raise RuntimeError(f"the math-verify worker raised {value}")
            return value

    def _start(self) -> None:
        self._stop()
        parent, child = multiprocessing.Pipe()
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}  # the parent's imports
        code = f"from {__name__} import _worker_main; _worker_main({child.fileno()})"
        proc = subprocess.Popen([sys.executable, "-c", code], pass_fds=(child.fileno(),), env=env,
                                stdin=subprocess.DEVNULL)
        child.close()
        self._proc, self._conn = proc, parent
        try:
            parent.send((self._target, self._init))
        except OSError:
            pass  # the child died at once: its exit code is reported below
        if not parent.poll(self._start_timeout):
            self._stop()
            raise RuntimeError(f"the math-verify worker process did not start within {self._start_timeout}s")
        try:
            started, value = parent.recv()
        except (EOFError, OSError):
            exit_code = proc.wait(5)
            self._stop()
            raise RuntimeError(f"the math-verify worker exited while starting (exit code {exit_code})") from None
        if started != "ready":
            self._stop()
            raise RuntimeError(f"the math-verify worker process failed to start: {value}")

    def _stop(self) -> None:
        proc, conn = self._proc, self._conn
        self._proc = self._conn = None
        if proc is not None:
            if proc.poll() is None:
                proc.kill()
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                pass  # unkillable for now; the OS reaps it when it goes
        if conn is not None:
            conn.close()

    def close(self) -> None:
        with self._lock:
            self._stop()


def _worker_main(fd: int) -> None:
    """The worker process's entry point: read ``(target, init)`` from the pipe, then serve."""
    from multiprocessing.connection import Connection

    os.set_inheritable(fd, False)  # no program the target starts may answer the parent in its place
    conn = Connection(fd)
    try:
        target, init = conn.recv()
    except (EOFError, OSError):
        return
    _serve(conn, target, init)


class _ThreadWorker:
    """Runs ``target`` in a fresh daemon thread per call; on timeout the thread is abandoned."""

    def __init__(self, target: Callable[..., Any]) -> None:
        self._target = target

    def call(self, args: tuple[Any, ...], timeout: float) -> Any:
        box: dict[str, Any] = {}
        done = threading.Event()

        def run() -> None:
            try:
                box["value"] = self._target(*args)
            except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread
                box["error"] = exc
            finally:
                done.set()

        threading.Thread(target=run, daemon=True, name="rlvr-math-verify").start()
        if not done.wait(timeout):
            raise GradingTimeout(f"no answer within {timeout}s; the verify thread was abandoned")
        if "error" in box:
            raise box["error"]
        return box["value"]

    def close(self) -> None:
        pass


def _close_all(workers: list[_ProcessWorker | _ThreadWorker]) -> None:
    for worker in workers:
        worker.close()
