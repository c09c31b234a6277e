"""Environments from today's hubs, played as black-box agents through the recording proxy.

``task.env = "verifiers-v1:TASKSET_ID"`` loads a verifiers 0.4 ``v1`` taskset, played by verifiers'
own environment and harness (its chat program) with the model client at the episode's proxy URL;
``task.env = "openenv:package.module:EnvClass"`` loads an OpenEnv environment (``openenv-core``): its
rows are its reset seeds (the first observation is the prompt), and each episode is played by the
hub worker (:mod:`rlvr.envs.hubs.worker`) in the hubs' own Python, every model call going through the
episode's proxy URL and the environment's own reward coming back with the conversation. ``env_args``
are the environment class's keyword arguments (the taskset config's fields, for verifiers), plus
``max_turns`` (default 4), ``action_field`` (the action's field replies go to, when it has several
text fields) and ``system_prompt`` for OpenEnv, ``harness`` for verifiers, and ``paths`` (folders the
worker imports environment modules from) for both.

Why a Python of their own: the hubs pin what rlvr's environment cannot share (verifiers 0.4 requires
``openai<3``; ``openenv-core`` pulls gradio and fastmcp), and an agent only needs an HTTP endpoint,
so they run beside rlvr as vLLM does (``make hubs`` builds ``.venv-hubs``; ``RLVR_HUBS_PYTHON`` names
another interpreter). One worker process serves a run, its episodes in threads.

Standard library only (the worker is a subprocess).
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

from rlvr.envs.import_check import check_import
from rlvr.errors import ConfigError, EnvError, MissingExtraError
from rlvr.protocols import LoadedEnv

WORKER = Path(__file__).with_name("worker.py")
HUBS_VENV = ".venv-hubs"
# A setup request (a hub's rows) has no other bound. An episode has one already, the loop's
# ``rollout_timeout_s`` on its own time (rlvr.rollouts.clock): the worker's wall clock would also count
# the episode's waits for the model and for a core, so a slow machine would fail a run it only slows.
SETUP_TIMEOUT_S = 600.0
CLOSE_TIMEOUT_S = 10.0


def hubs_python() -> str:
    """``$RLVR_HUBS_PYTHON``, else ``.venv-hubs`` here or at the source checkout's root."""
    given = os.environ.get("RLVR_HUBS_PYTHON")
    if given:
        return given
    for root in (Path.cwd(), Path(__file__).resolve().parents[4]):
        candidate = root / HUBS_VENV / "bin" / "python"
        if candidate.exists():
            return str(candidate)
    raise MissingExtraError(f"hub environments run in their own Python: build it with `make hubs` ({HUBS_VENV}: "
                            "openenv-core, verifiers 0.4) or set RLVR_HUBS_PYTHON to an interpreter that has them")


class HubWorker:
    """The worker process: ``call(request)`` blocks until its answer (requests may overlap).

    Requests and replies travel over a socket pair of its own (see :mod:`rlvr.envs.hubs.worker`),
    never over the worker's stdout: an environment prints what the model said, and a reply is the
    reward. (A socket, not a pipe: a program of the same user can open another process's pipe
    through ``/proc/PID/fd``, never its socket.) Whatever the worker, its environment and their
    programs print (stdout and stderr) comes to this process's stderr, each line prefixed ``hub
    worker:``, and is never read as a reply. The worker leads a process group of its own; ``close``
    (and the worker itself, when this process is gone) ends the whole group, the programs its
    episodes started included."""

    def __init__(self, python: str | None = None):
        self.python = python or hubs_python()
        path = os.pathsep.join(filter(None, [os.getcwd(), os.environ.get("PYTHONPATH")]))  # specs resolve from here
        ours, theirs = socket.socketpair()
        try:
            self.proc = subprocess.Popen([self.python, str(WORKER), str(theirs.fileno())], pass_fds=(theirs.fileno(),),
                                         stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                         text=True, errors="replace", env={**os.environ, "PYTHONPATH": path},
                                         start_new_session=True)
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        self._channel = ours
        self._requests = ours.makefile("w", encoding="utf-8")
        self._ids = itertools.count()
        self._waiting: dict[int, list[Any]] = {}  # id -> [event, reply]
        self._lock = threading.Lock()
        self._closed = False
        threading.Thread(target=self._read, name="rlvr-hub-worker", daemon=True).start()
        self._logger = threading.Thread(target=self._log, name="rlvr-hub-worker-log", daemon=True)
        self._logger.start()

    def call(self, request: dict[str, Any], timeout_s: float | None = None) -> Any:
        """The worker's answer to ``request``; ``timeout_s=None`` waits as long as the worker lives."""
        rid = next(self._ids)
        slot: list[Any] = [threading.Event(), None]
        with self._lock:
            if self._closed or self.proc.poll() is not None:
                raise EnvError(f"the hub worker ({self.python}) exited with status {self.proc.poll()}")
            self._waiting[rid] = slot
            try:
                self._requests.write(json.dumps({**request, "id": rid}) + "\n")
                self._requests.flush()
            except OSError:
                self._waiting.pop(rid, None)
                raise EnvError(f"the hub worker ({self.python}) exited before {request['op']!r} was sent") from None
        if not slot[0].wait(timeout_s):
            raise EnvError(f"the hub worker gave no answer to {request['op']!r} within {timeout_s:g}s")
        reply = slot[1]
        if reply is None:
            raise EnvError(f"the hub worker ({self.python}) exited during {request['op']!r}")
        if not reply.get("ok"):
            raise EnvError(f"hub {request['hub']!r} {request['op']!r} failed in the worker: {reply.get('error')}")
        return reply["result"]

    def _read(self) -> None:
        """The channel's replies: only the worker's answering code writes them."""
        with self._channel.makefile("r", encoding="utf-8", errors="replace") as replies:
            for line in replies:
                try:
                    reply = json.loads(line)
                except ValueError:
                    reply = None
                rid = reply.get("id") if isinstance(reply, dict) else None
                with self._lock:
                    slot = self._waiting.pop(rid, None) if isinstance(rid, int) else None
                if slot is None:
                    print(f"hub worker: a reply that answers no request: {line.rstrip()[:200]}", file=sys.stderr)
                    continue
                slot[1] = reply
                slot[0].set()
        with self._lock:  # the worker is gone: wake everyone still waiting
            for slot in self._waiting.values():
                slot[0].set()
            self._waiting.clear()

    def _log(self) -> None:
        """The worker's stdout and stderr (its environment's prints, its tracebacks): the log's, never replies."""
        for line in self.proc.stdout:  # type: ignore[union-attr]
            print(f"hub worker: {line.rstrip()}", file=sys.stderr)

    def close(self) -> None:
        """Ends the worker and every program its episodes started (its process group); idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            with contextlib.suppress(OSError):
                self._requests.close()
            with contextlib.suppress(OSError):
                self._channel.shutdown(socket.SHUT_WR)  # the end of requests: the worker ends its group
        try:
            self.proc.wait(timeout=CLOSE_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            pass
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)  # whatever of the group is left (the group outlives its leader)
        self.proc.wait()
        with contextlib.suppress(OSError):
            self._channel.shutdown(socket.SHUT_RDWR)  # wakes the reader, should anything still hold the other end
        self._channel.close()
        self._logger.join(CLOSE_TIMEOUT_S)  # its last lines are in the log when close returns


class HubEnv:
    """One hub environment: its rows, and ``agent(base_url, row)``, the episode the run plays
    through the recording proxy (see :mod:`rlvr.rollouts.agents`)."""

    def __init__(self, hub: str, spec: str, args: dict[str, Any], episode: dict[str, Any],
                 paths: list[str] | None = None):
        self.hub, self.spec, self.args, self.episode = hub, spec, args, episode
        self.common = {"hub": hub, "spec": spec, "args": args, "paths": list(paths or []),
                       **({"harness": episode["harness"]} if "harness" in episode else {})}
        self._worker: HubWorker | None = None
        self._lock = threading.Lock()

    @property
    def worker(self) -> HubWorker:
        with self._lock:
            if self._worker is None:
                self._worker = HubWorker()
            return self._worker

    def make_rows(self, n: int, *, seed: int = 0) -> list[dict[str, Any]]:
        return self.worker.call({"op": "rows", **self.common, "n": n, "seed": seed}, timeout_s=SETUP_TIMEOUT_S)

    def agent(self, base_url: str, row: dict[str, Any]) -> dict[str, Any]:
        """One episode, bounded by the loop's ``rollout_timeout_s`` (see ``SETUP_TIMEOUT_S``). One the
        loop gave up on ends when the hub's program does: its model calls are refused once the
        episode's proxy session is closed, or ``close`` ends the worker."""
        request = {"op": "episode", **self.common, "base_url": base_url, "row": row, **self.episode}
        return self.worker.call(request)

    def reward_fn(self, messages: list[dict[str, Any]], answer: Any) -> float | None:
        """For conversations scored outside an episode (the warm start's accuracy check): the last
        reply against the hub's reference answer, exactly; ``None`` without one. Every episode
        carries the hub's own reward instead."""
        if not isinstance(answer, str) or not messages:
            return None
        return float(str(messages[-1].get("content") or "").strip() == answer.strip())

    def close(self) -> None:
        if self._worker is not None:
            self._worker.close()


def openenv_env(spec: str, *, max_turns: int = 4, action_field: str | None = None, system_prompt: str | None = None,
                paths: list[str] | None = None, **args: Any) -> LoadedEnv:
    """``openenv:package.module:EnvClass`` as a run's environment (see the module docstring)."""
    if ":" not in spec:
        raise ConfigError(f"task.env='openenv:{spec}': name the environment class, 'openenv:package.module:Class'")
    if not isinstance(max_turns, int) or max_turns < 1:
        raise ConfigError(f"env_args.max_turns={max_turns!r}: an OpenEnv episode needs at least one turn")
    location = spec.rpartition(":")[0]
    check_import(location, location.endswith(".py") or "/" in location)  # a worker's setup checks what it names
    env = HubEnv("openenv", spec, args, {"max_turns": max_turns, "action_field": action_field,
                                         "system_prompt": system_prompt}, paths)
    return LoadedEnv(f"openenv:{spec.rpartition(':')[2]}", env.reward_fn, None, env.make_rows,
                     f"openenv:{spec}", env)


def verifiers_v1_env(spec: str, *, harness: str = "null", paths: list[str] | None = None, **args: Any) -> LoadedEnv:
    """``verifiers-v1:TASKSET_ID`` as a run's environment: a verifiers 0.4 ``v1`` taskset (``env_args``
    are its config's fields, e.g. ``n``), each episode played by verifiers' own ``SingleAgentEnv`` and
    harness (``harness``, default ``null``: its chat program) with its model client pointed at the
    episode's proxy URL; the reward is the taskset's ``@reward`` sum."""
    if not spec:
        raise ConfigError("task.env='verifiers-v1:': name the taskset, 'verifiers-v1:TASKSET_ID'")
    check_import(spec.replace("-", "_"))  # a worker's setup checks what it names
    env = HubEnv("verifiers", spec, args, {"harness": harness}, paths)
    return LoadedEnv(f"verifiers-v1:{spec}", env.reward_fn, None, env.make_rows, f"verifiers-v1:{spec}", env)
