"""Reward workers: a reward run in a small pool of worker processes, each call bounded.

``RewardWorkers(spec, workers=N, timeout_s=T)`` is a reward function (``takes_task``: it is called
``(messages, answer, row)``) that sends each call to one of ``N`` worker processes and returns what
the environment's reward returned there (a float, a :class:`~rlvr.reward.Score` or ``None``), which
the caller reads as any reward (:func:`rlvr.reward.evaluate_reward`). Each worker is a fresh
interpreter (``python -m rlvr.envs.reward_worker``, spawned, never forked) that loads the
environment itself from ``spec`` (an import path of a loader and its keyword arguments, e.g.
:func:`load_env`), so the environment need not be picklable; only the conversation, the answer and
the row travel, and the reward's result comes back.

What it keeps invariant:
- a call waits for a free worker, then at most ``timeout_s`` for its answer: a worker that has not
  answered by then is killed (its whole process group) and replaced, and the call raises
  :class:`~rlvr.errors.RewardError` naming the row (a sample error the stream counts or fails on);
- a worker that dies during a call (a crash, an OOM kill) is replaced and the call tried once more,
  on the new worker; a second death is a :class:`RewardError` naming the row;
- an exception raised by the reward comes back as a :class:`RewardError` naming the row and the
  exception; the worker lives on;
- ``bounds_itself``: :func:`rlvr.reward.evaluate_reward_within` adds no thread bound of its own, so
  time spent waiting for a free worker never counts against a call.

Standard library only (this module never imports the environment it runs).
"""

from __future__ import annotations

import atexit
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
import weakref
from collections.abc import Mapping, Sequence
from multiprocessing.connection import Connection
from typing import Any

from rlvr.errors import ConfigError, RewardError
from rlvr.protocols import LoadedEnv
from rlvr.types import Message, Task

STARTUP_TIMEOUT_S = 120.0  # loading the environment in a fresh interpreter
_LIVE: weakref.WeakSet[RewardWorkers] = weakref.WeakSet()


def load_env(env: str | None = None, name: str | None = None, env_args: Mapping[str, Any] | None = None,
             rewards: Sequence[str] = (), reward_weights: Sequence[float] | None = None) -> LoadedEnv:
    """The environment of a ``[task]`` section, as the training process loads it: ``rewards`` summed
    with ``reward_weights``, else ``env`` (or the procedural task ``name``) built with ``env_args``."""
    from rlvr.envs import environment
    from rlvr.envs.trl import rewards_env

    if rewards:
        return rewards_env(list(rewards), list(reward_weights) if reward_weights is not None else None,
                           load=environment)
    return environment(env or name, **dict(env_args or {}))  # type: ignore[arg-type]


class _Worker:
    """One worker process and our end of its socket; ``ready`` once it loaded the environment."""

    def __init__(self, spec: tuple[str, dict[str, Any]], index: int):
        ours, theirs = socket.socketpair()
        self.index = index
        self.proc = subprocess.Popen([sys.executable, "-m", "rlvr.envs.reward_worker", str(theirs.fileno())],
                                     pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL, start_new_session=True)
        theirs.close()
        self.conn = Connection(ours.detach())
        self.conn.send(spec)
        self.ready = False
        self.name = ""

    def wait_ready(self, timeout_s: float) -> None:
        if self.ready:
            return
        if not self.conn.poll(timeout_s):
            raise RewardError(f"reward worker {self.index} (pid {self.proc.pid}) did not load the environment "
                              f"within {timeout_s:g}s")
        kind, body = self.conn.recv()
        if kind != "ready":
            raise ConfigError(f"reward worker {self.index} could not load the environment: {body}")
        self.ready, self.name = True, body

    def kill(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)  # the worker leads its own group: its children go too
        except (ProcessLookupError, PermissionError):
            pass
        self.proc.wait()
        self.conn.close()


class RewardWorkers:
    """A reward function run in ``workers`` processes; see the module docstring."""

    takes_task = True  # called (messages, answer, row): the row's id names a failed call
    bounds_itself = True

    def __init__(self, spec: tuple[str, Mapping[str, Any]], *, workers: int, timeout_s: float | None,
                 startup_timeout_s: float = STARTUP_TIMEOUT_S):
        if workers < 1:
            raise ConfigError(f"task.reward_workers must be >= 1 for a worker pool, got {workers}")
        self.spec = (spec[0], dict(spec[1]))
        self.n, self.timeout_s, self.startup_timeout_s = workers, timeout_s, startup_timeout_s
        self._lock = threading.Lock()
        self._idle: queue.Queue[_Worker] = queue.Queue()
        self._all: list[_Worker] = []
        self._spawned = 0
        self.calls = self.timeouts = self.replaced = 0
        self.name = "reward"
        _LIVE.add(self)
        try:
            workers_ = [self._spawn() for _ in range(workers)]
            for worker in workers_:  # all loading at once; any that fails stops the run before step 0
                worker.wait_ready(startup_timeout_s)
                self._idle.put(worker)
        except BaseException:
            self.close()
            raise
        self.name = workers_[0].name

    def __call__(self, messages: Sequence[Message], answer: Any, row: Task | None = None) -> Any:
        where = f"row {row.id!r}" if row is not None else "a conversation"
        payload = (list(messages), answer, row)
        with self._lock:
            self.calls += 1
        for attempt in (1, 2):
            worker = self._idle.get()
            try:
                worker.wait_ready(self.startup_timeout_s)
                worker.conn.send(payload)
                if not worker.conn.poll(self.timeout_s):
                    self._replace(worker, timed_out=True)
                    raise RewardError(f"reward of {self.name!r} on {where} did not return within "
                                      f"reward_timeout_s={self.timeout_s:g}s; its worker (pid {worker.proc.pid}) "
                                      "was killed and replaced")
                kind, body = worker.conn.recv()
            except (EOFError, OSError):
                code = worker.proc.poll()
                self._replace(worker)
                if attempt == 2:
                    raise RewardError(f"reward of {self.name!r} on {where}: its worker died twice (last exit "
                                      f"code {code}); the reward crashes its process on this row") from None
                continue
            except BaseException:
                if worker in self._all and worker.proc.poll() is None and worker.ready:
                    self._idle.put(worker)
                elif worker in self._all:
                    self._replace(worker)  # never ready, or dead: a fresh one, so the pool keeps its size
                raise
            self._idle.put(worker)
            if kind == "raised":
                raise RewardError(f"reward of {self.name!r} on {where} raised {body}")
            return body
        raise AssertionError("unreachable")

    def _spawn(self) -> _Worker:
        with self._lock:
            worker = _Worker(self.spec, self._spawned)
            self._spawned += 1
            self._all.append(worker)
        return worker

    def _replace(self, worker: _Worker, *, timed_out: bool = False) -> None:
        worker.kill()
        with self._lock:
            self._all.remove(worker)
            self.replaced += 1
            self.timeouts += timed_out
        self._idle.put(self._spawn())  # loads in the background; the next call on it waits for that

    def close(self) -> None:
        """Stop every worker; idempotent."""
        with self._lock:
            workers, self._all = self._all, []
        for worker in workers:
            try:
                worker.conn.send(None)  # a clean exit when it is idle
            except OSError:
                pass
        deadline = time.monotonic() + 2.0
        for worker in workers:
            try:
                worker.proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
            worker.kill()
        _LIVE.discard(self)

    def pids(self) -> list[int]:
        with self._lock:
            return [w.proc.pid for w in self._all]

    def describe(self) -> dict[str, Any]:
        return {"type": f"{__name__}.{type(self).__name__}", "workers": self.n, "timeout_s": self.timeout_s,
                "env": self.name, "loader": self.spec[0], "calls": self.calls, "timeouts": self.timeouts,
                "replaced": self.replaced}


@atexit.register
def _stop_all() -> None:
    for pool in list(_LIVE):
        try:
            pool.close()
        except Exception:  # noqa: BLE001 - best effort at interpreter exit
            pass
