"""Reward workers as Ray actors: :class:`RewardActor` and the slots :class:`ActorRewardPool` drives.

Each actor loads the environment itself from ``spec`` (an import path of a loader and its keyword
arguments, as :class:`~rlvr.envs.workers.RewardWorkers` takes), so the environment need not be
picklable; one call scores one sample. Ray places the actors (in the role's placement group),
restarts one whose process dies (``max_restarts``) and retries the call it was running
(``max_task_retries``: scoring a sample is idempotent); :class:`RaySlot` waits for each call with
``ray.get(..., timeout=)``, restarts an actor that overran with ``ray.kill(no_restart=False)`` and
replaces one that is gone for good. The pool's policy (what is retried, what is recorded) lives
in :mod:`rlvr.backends.cluster.actor_pool`.

A backend module: imports ray.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from typing import Any

import ray
import ray.exceptions

from rlvr.backends.cluster.actor_pool import ActorRewardPool
from rlvr.errors import ActorLost, ActorTimeout, ConfigError


def actor_where() -> dict[str, Any]:
    """The node and process this code runs in, for the run record."""
    ctx = ray.get_runtime_context()
    return {"node_id": ctx.get_node_id(), "ip": ray.util.get_node_ip_address(), "pid": os.getpid()}


class RewardActor:
    """One reward worker (made a Ray actor class by :func:`reward_pool`)."""

    def __init__(self, spec: tuple[str, dict[str, Any]]):
        from rlvr.envs.loading import load_object
        from rlvr.reward import name_of

        loader, kwargs = spec
        env = load_object(loader)(**kwargs)
        self.fn = getattr(env, "reward_fn", env)
        if not callable(self.fn):
            raise TypeError(f"reward_fn is {self.fn!r}, not a function")
        self.name = str(getattr(env, "name", None) or name_of(self.fn, "reward"))

    def ready(self) -> tuple[str, dict[str, Any]]:
        return self.name, actor_where()

    def where(self) -> dict[str, Any]:
        return actor_where()

    def score(self, messages: Any, answer: Any, row: Any) -> tuple[str, Any, int]:
        import pickle

        from rlvr.errors import exception_at
        from rlvr.reward import call_reward

        try:
            result = call_reward(self.fn, messages, answer, row)
            pickle.dumps(result)  # a result that cannot travel back is the reward's error, named as such
        except Exception as exc:  # noqa: BLE001 - every failure goes back to the caller, named
            return "raised", exception_at(exc), os.getpid()
        return "ok", result, os.getpid()


class RaySlot:
    """One reward actor, as :class:`~rlvr.backends.cluster.actor_pool.ActorRewardPool` drives it."""

    def __init__(self, make: Callable[[str], Any], name: str, startup_timeout_s: float,
                 on_start: Callable[[dict[str, Any]], None]):
        self.make, self.name, self.startup_timeout_s, self.on_start = make, name, startup_timeout_s, on_start
        self.actor = make(name)
        self._where: dict[str, Any] = {}
        self.env_name = ""

    def wait_ready(self) -> None:
        try:
            self.env_name, self._where = ray.get(self.actor.ready.remote(), timeout=self.startup_timeout_s)
        except ray.exceptions.GetTimeoutError:
            raise ConfigError(f"{self.name} was not placed and ready within cluster.startup_timeout_s="
                              f"{self.startup_timeout_s:g}s: the Ray cluster lacks the CPUs asked for "
                              "(cluster.reward_cpus each), or loading the environment hangs") from None
        except ray.exceptions.RayError as exc:
            raise ConfigError(f"{self.name} could not load the environment: {_cause(exc)}") from None
        self.on_start({"role": "reward", "name": self.name, **self._where})

    def call(self, payload: tuple[Any, Any, Any], timeout_s: float | None) -> tuple[str, Any, int]:
        try:
            kind, body, pid = ray.get(self.actor.score.remote(*payload), timeout=timeout_s)
        except ray.exceptions.GetTimeoutError:
            raise ActorTimeout() from None
        except ray.exceptions.RayActorError as exc:
            raise ActorLost(f"{self.name} died ({_cause(exc)})") from None
        if pid != self._where.get("pid"):
            self._where = self._refresh()
        return kind, body, pid

    def _refresh(self) -> dict[str, Any]:
        try:
            return ray.get(self.actor.where.remote(), timeout=30)
        except ray.exceptions.RayError:
            return self._where

    def restart(self) -> None:
        # A fresh actor in this slot, not a Ray restart: Ray would run the hung call again on the
        # restarted actor (max_task_retries), and the next row would wait for it.
        ray.kill(self.actor, no_restart=True)
        self.actor = self.make(self.name)
        self.wait_ready()

    def replace(self) -> RaySlot:
        ray.kill(self.actor, no_restart=True)  # a restarting actor must not come back beside its replacement
        new = RaySlot(self.make, f"{self.name}'", self.startup_timeout_s, self.on_start)
        new.wait_ready()
        return new

    def where(self) -> dict[str, Any]:
        return dict(self._where)

    def kill(self) -> None:
        try:
            ray.kill(self.actor, no_restart=True)
        except ray.exceptions.RayError:
            pass


def _cause(exc: BaseException) -> str:
    """The line of a Ray error that says what went wrong: the exception raised in the actor (the last
    ``...Error: message`` line of the traceback Ray carries), else Ray's own first line."""
    lines = [re.sub(r"\x1b\[[0-9;]*m", "", line).strip() for line in str(exc).strip().splitlines()]
    raised = [line for line in lines if re.match(r"^[\w.]+(Error|Exception|Exit|Interrupt)\b.*:", line)]
    return raised[-1] if raised else (lines[0] if lines else type(exc).__name__)


def reward_pool(spec: tuple[str, dict[str, Any]], *, workers: int, timeout_s: float | None,
                options: Callable[[str], dict[str, Any]], startup_timeout_s: float,
                on_start: Callable[[dict[str, Any]], None], log: Callable[[str], None] = print) -> ActorRewardPool:
    """``workers`` reward actors, each placed with ``options(name)`` (resources, placement group,
    restarts), all loading the environment at once; any that fails stops the run before step 0."""
    actor_class = ray.remote(RewardActor)

    def make(name: str) -> Any:
        return actor_class.options(**options(name)).remote((spec[0], dict(spec[1])))

    slots: list[RaySlot] = []
    try:
        for i in range(workers):
            slots.append(RaySlot(make, f"reward actor {i}", startup_timeout_s, on_start))
        for slot in slots:
            slot.wait_ready()
    except BaseException:
        for slot in slots:
            slot.kill()
        raise
    return ActorRewardPool(slots, timeout_s=timeout_s, env_name=slots[0].env_name, engine="Ray", log=log)
