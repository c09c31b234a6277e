"""Rollout workers as Ray actors: :class:`RolloutActor` and its client, :class:`RayRolloutService`.

Each actor is an asyncio actor holding a :class:`~rlvr.backends.rollout.worker.WorkerCore`: rows run
concurrently on its event loop, as in an ``rlvr rollout-worker``. The actors of a run are made once
(:func:`rollout_actors`, in the ``rollout`` placement group) and shared by every environment's
:class:`RayRolloutService` (each sends its own setup). Calls are never retried by Ray
(``max_task_retries = 0``): an actor that dies mid-row fails the call (:class:`~rlvr.errors.WorkerLost`)
and the adapter sends the row to another worker, recorded. Ray restarts a dead actor
(``cluster.max_restarts``); one gone for good is replaced by a fresh actor when the adapter pings it,
so a worker comes back either way (its setup is sent again: a restarted actor holds none).

A backend module: imports ray.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import ray
import ray.exceptions

from rlvr.backends.cluster.ray_rewards import actor_where
from rlvr.errors import BackendError, ConfigError, WorkerLost
from rlvr.protocols import SampleOutcome
from rlvr.rollouts.remote import RowJob
from rlvr.rollouts.wire import job_to_wire, outcome_from_wire


class RolloutActor:
    """One rollout worker (made a Ray actor class by :func:`rollout_actors`)."""

    def __init__(self) -> None:
        from rlvr.backends.rollout.worker import WorkerCore

        self.core = WorkerCore()  # a trusted cluster: setups may name any file the node has

    def ready(self) -> dict[str, Any]:
        return actor_where()

    async def setup(self, spec: dict[str, Any]) -> str:
        return await asyncio.to_thread(self.core.setup, spec)

    async def run(self, sid: str, job: dict[str, Any]) -> dict[str, Any]:
        from rlvr.errors import UnknownSetupError

        try:
            return {"outcomes": await self.core.run(sid, job)}
        except UnknownSetupError:
            return {"unknown_setup": sid}


class RayWorker:
    """One actor slot, shared by the services of every environment: replaced when gone for good."""

    def __init__(self, make: Callable[[str], Any], name: str, startup_timeout_s: float,
                 on_start: Callable[[dict[str, Any]], None]):
        self.make, self.name, self.startup_timeout_s, self.on_start = make, name, startup_timeout_s, on_start
        self.actor = make(name)
        self.incarnation = 0  # bumped on every replacement: each service sends its setup again
        self.place: dict[str, Any] = {}

    def wait_ready(self) -> None:
        try:
            self.place = ray.get(self.actor.ready.remote(), timeout=self.startup_timeout_s)
        except ray.exceptions.GetTimeoutError:
            raise ConfigError(f"{self.name} was not placed and ready within cluster.startup_timeout_s="
                              f"{self.startup_timeout_s:g}s: the Ray cluster lacks the CPUs asked for "
                              "(cluster.rollout_cpus each)") from None
        self.on_start({"role": "rollout", "name": self.name, **self.place})

    async def ping(self, timeout_s: float) -> bool:
        """Answers now (a restarted actor included); one gone for good is replaced by a fresh actor."""
        try:
            self.place = await asyncio.wait_for(asyncio.wrap_future(self.actor.ready.remote().future()), timeout_s)
            return True
        except ray.exceptions.ActorDiedError:
            pass
        except (ray.exceptions.RayError, TimeoutError):
            return False  # restarting, or not placed yet: asked again later
        ray.kill(self.actor, no_restart=True)
        self.incarnation += 1
        self.actor = self.make(f"{self.name}'{self.incarnation}")
        await asyncio.to_thread(self.wait_ready)
        return True

    def kill(self) -> None:
        try:
            ray.kill(self.actor, no_restart=True)
        except ray.exceptions.RayError:
            pass


class RayRolloutService:
    """A :class:`~rlvr.rollouts.remote.RolloutService` on one actor slot, for one setup."""

    def __init__(self, worker: RayWorker, spec: dict[str, Any]):
        self.worker, self.spec, self.name = worker, spec, worker.name
        self._setup: tuple[int, str] | None = None  # (incarnation, setup id)

    async def _call(self, method: Any, *args: Any) -> Any:
        try:
            return await asyncio.wrap_future(method.remote(*args).future())
        except ray.exceptions.RayActorError as exc:
            raise WorkerLost(f"its Ray actor died ({type(exc).__name__})") from None
        except ray.exceptions.RayTaskError as exc:
            raise BackendError(f"{self.name}: {str(exc).strip().splitlines()[-1]}") from None

    async def _sid(self) -> str:
        if self._setup is None or self._setup[0] != self.worker.incarnation:
            sid = await self._call(self.worker.actor.setup, self.spec)
            self._setup = (self.worker.incarnation, sid)
        return self._setup[1]

    async def run_row(self, job: RowJob) -> list[SampleOutcome]:
        wire = job_to_wire(job)
        for _attempt in (1, 2):
            answer = await self._call(self.worker.actor.run, await self._sid(), wire)
            if "unknown_setup" not in answer:
                return [outcome_from_wire(o) for o in answer["outcomes"]]
            self._setup = None  # Ray restarted the actor: it holds no setup
        raise BackendError(f"{self.name} lost the run's setup twice in one row")

    async def ping(self) -> bool:
        return await self.worker.ping(timeout_s=10.0)

    def where(self) -> dict[str, Any]:
        return {"kind": "ray", **self.worker.place}

    def close(self) -> None:
        pass  # the actor is the run's, shared by every environment: rollout_actors' caller kills it


def rollout_actors(count: int, *, options: Callable[[str], dict[str, Any]], startup_timeout_s: float,
                   on_start: Callable[[dict[str, Any]], None]) -> list[RayWorker]:
    """``count`` rollout actors placed with ``options(name)``, all started at once and ready."""
    actor_class = ray.remote(RolloutActor)

    def make(name: str) -> Any:
        return actor_class.options(**options(name)).remote()

    workers: list[RayWorker] = []
    try:
        for i in range(count):
            workers.append(RayWorker(make, f"rollout actor {i}", startup_timeout_s, on_start))
        for worker in workers:
            worker.wait_ready()
    except BaseException:
        for worker in workers:
            worker.kill()
        raise
    return workers
