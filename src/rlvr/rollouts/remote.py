"""Rollout functions run by remote workers: the service Protocol and the remote adapter.

A :class:`RolloutService` is one worker outside the training process (a Ray actor, an ``rlvr
rollout-worker`` over HTTP: :mod:`rlvr.backends.rollout`) that runs the run's rollout function.
Its unit of work is a **row** (:class:`RowJob`): the row, the policy version it was admitted
under, its ``group_k`` samples' seeds, the per-sample bound, and the policy's servers as the
trainer sees them now (URL, served model name, served version); it answers one outcome per sample,
exactly what :func:`~rlvr.rollouts.episodes.group_from_rollout_fn` gives locally. A whole row on one
worker keeps a group's samples together (an HTTP server batches them into one request), as they
are in the training process.

:class:`RemoteRollouts` is the adapter the loop sees: a rollout function (one sample) that also
offers :meth:`RemoteRollouts.group_fn` (whole rows, which the loop prefers), so admission, the
staleness bound, seeds, scoring, drops and the record are the stream's, unchanged. It keeps:

- **dispatch**: each row goes to the live worker with the fewest rows in flight (the first such);
- **no row is lost**: a worker that fails a row with :class:`~rlvr.errors.WorkerLost` (its process
  died, its connection dropped, it overran ``row_timeout_s``) is taken out of rotation, and the row
  is sent, whole and with the same seeds, to another worker; each loss is counted and is a printed
  line and a ``warning`` for the run record (:meth:`take_warnings`). A worker out of rotation is
  pinged every ``revive_every_s`` and comes back when it answers (a restarted Ray actor, a
  restarted HTTP worker), also recorded. A row every worker has failed raises a
  :class:`~rlvr.errors.BackendError`; with no worker answering for ``give_up_after_s`` the run stops
  with :class:`~rlvr.errors.WorkersLostError` (recorded and checkpointed as an abort: ``rlvr resume``
  continues it).

Standard library only.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from rlvr.errors import BackendError, WorkerLost, WorkersLostError
from rlvr.protocols import GroupFn, SampleOutcome
from rlvr.types import RolloutRequest, Task


@dataclass(frozen=True, slots=True)
class RowJob:
    """One row's samples for a worker (see the module docstring)."""

    task: Task
    version: int  # the policy version the row was admitted under
    seeds: tuple[int, ...]  # one per sample, derived from the row's coordinates
    sample_timeout_s: float | None  # loop.rollout_timeout_s: each sample bounded where it runs
    servers: tuple[dict[str, Any], ...] = ()  # the policy's servers now: url, model, served_version


class RolloutService(Protocol):
    """One remote worker. ``run_row`` raises :class:`~rlvr.errors.WorkerLost` when the worker is gone
    (the row is then sent elsewhere); any other error is the row's own."""

    name: str

    async def run_row(self, job: RowJob) -> list[SampleOutcome]: ...

    async def ping(self) -> bool: ...

    def where(self) -> dict[str, Any]: ...

    def close(self) -> None: ...


@dataclass
class _Worker:
    service: RolloutService
    in_flight: int = 0
    down: str | None = None  # why it left the rotation
    down_since: float = 0.0
    pinging: bool = False
    rows: int = 0


@dataclass
class _Stats:
    rows: int = 0
    lost: int = 0  # rows a worker lost (each was sent again)
    revived: int = 0
    warnings: list[dict[str, Any]] = field(default_factory=list)


class RemoteRollouts:
    """A rollout function whose rows run on ``services``; see the module docstring. ``servers()`` reads
    the policy's servers as the trainer's generator points at them now (called per row)."""

    def __init__(self, services: Sequence[RolloutService], *, servers: Callable[[], Sequence[dict[str, Any]]] = tuple,
                 row_timeout_s: float | None = None, revive_every_s: float = 5.0, give_up_after_s: float = 120.0,
                 name: str = "remote rollouts", log: Callable[[str], None] = print):
        if not services:
            raise ValueError("RemoteRollouts needs at least one worker")
        self.workers = [_Worker(s) for s in services]
        self.servers, self.row_timeout_s, self.name, self.log = servers, row_timeout_s, name, log
        self.revive_every_s, self.give_up_after_s = revive_every_s, give_up_after_s
        self.stats = _Stats()
        self._lock = threading.Lock()

    # ---- what the loop calls ----------------------------------------------------------------
    async def __call__(self, request: RolloutRequest) -> SampleOutcome:
        """One sample (the rollout-function form): a row of one."""
        outcomes = await self.run(RowJob(request.task, request.version, (request.seed,), None,
                                         tuple(self.servers())))
        outcome = outcomes[0]
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome

    def group_fn(self, timeout_s: float | None) -> GroupFn:
        """Whole rows: ``(task, k, version, seed_of) -> k outcomes``, each sample bounded by ``timeout_s``
        on its worker."""

        async def group(task: Task, k: int, version: int, seed_of: Callable[[int], int]) -> list[SampleOutcome]:
            job = RowJob(task, version, tuple(seed_of(i) for i in range(k)), timeout_s, tuple(self.servers()))
            return await self.run(job)

        return group

    async def run(self, job: RowJob) -> list[SampleOutcome]:
        """The row on a live worker; sent again elsewhere when its worker is lost."""
        tried: list[str] = []
        while True:
            worker = await self._pick(job, tried)
            worker.in_flight += 1
            try:
                outcomes = await self._bounded(worker, job)
            except WorkerLost as exc:
                tried.append(worker.service.name)
                self._lost(worker, job, str(exc))
                continue
            finally:
                worker.in_flight -= 1
            if len(outcomes) != len(job.seeds):
                raise BackendError(f"{worker.service.name} answered {len(outcomes)} samples for row {job.task.id!r}, "
                                   f"which has {len(job.seeds)}")
            worker.rows += 1
            with self._lock:
                self.stats.rows += 1
            return outcomes

    async def _bounded(self, worker: _Worker, job: RowJob) -> list[SampleOutcome]:
        if self.row_timeout_s is None:
            return await worker.service.run_row(job)
        try:
            return await asyncio.wait_for(worker.service.run_row(job), self.row_timeout_s)
        except TimeoutError:
            raise WorkerLost(f"no answer within {self.row_timeout_s:g}s") from None

    async def _pick(self, job: RowJob, tried: list[str]) -> _Worker:
        """The live worker with the fewest rows in flight, not one that already lost this row; waits
        (pinging) while none is live, up to ``give_up_after_s``."""
        waited_since = time.monotonic()
        while True:
            self._ping_due()
            live = [w for w in self.workers if w.down is None]
            fresh = [w for w in live if w.service.name not in tried]
            if fresh:
                return min(fresh, key=lambda w: w.in_flight)
            if live and len(set(tried)) >= len(self.workers):
                raise BackendError(f"row {job.task.id!r} was lost by every rollout worker ({', '.join(tried)}); "
                                   "it takes its worker down each time: see the workers' logs")
            if live:  # only workers that lost this row are up: a second try there beats waiting
                return min(live, key=lambda w: w.in_flight)
            if time.monotonic() - waited_since > self.give_up_after_s:
                why = "; ".join(f"{w.service.name}: {w.down}" for w in self.workers)
                raise WorkersLostError(f"no rollout worker has answered for {self.give_up_after_s:g}s ({why}); "
                                       "the run stopped at a checkpoint: restart the workers, then `rlvr resume`")
            await asyncio.sleep(min(1.0, self.revive_every_s))

    def _lost(self, worker: _Worker, job: RowJob, why: str) -> None:
        with self._lock:
            self.stats.lost += 1
        first = worker.down is None
        worker.down, worker.down_since = why, time.monotonic()
        self._warn("rollout_worker_lost", worker, f"{why}; row {job.task.id!r} sent to another worker",
                   row=job.task.id, left_rotation=first)

    def _ping_due(self) -> None:
        now = time.monotonic()
        for w in self.workers:
            if w.down is not None and not w.pinging and now - w.down_since >= self.revive_every_s:
                w.pinging = True
                asyncio.ensure_future(self._revive(w))

    async def _revive(self, worker: _Worker) -> None:
        try:
            ok = await asyncio.wait_for(worker.service.ping(), max(self.revive_every_s, 5.0))
        except Exception:  # noqa: BLE001 - a failed ping is a "not yet"
            ok = False
        finally:
            worker.pinging = False
        if ok and worker.down is not None:
            was, worker.down = worker.down, None
            with self._lock:
                self.stats.revived += 1
            self._warn("rollout_worker_back", worker, f"answers again (it had left: {was})")
        elif worker.down is not None:
            worker.down_since = time.monotonic()

    def _warn(self, kind: str, worker: _Worker, reason: str, **extra: Any) -> None:
        warning = {"warning": kind, "worker": worker.service.name, "node": worker.service.where(), "reason": reason,
                   **extra}
        with self._lock:
            self.stats.warnings.append(warning)
        self.log(f"rollout workers: {worker.service.name} {reason}")

    # ---- for the run record ---------------------------------------------------------------------
    def take_warnings(self) -> list[dict[str, Any]]:
        """Losses and returns since the last call, for the run record's warning events."""
        with self._lock:
            out, self.stats.warnings = self.stats.warnings, []
        return out

    def describe(self) -> dict[str, Any]:
        return {"type": f"{__name__}.{type(self).__name__}", "name": self.name, "row_timeout_s": self.row_timeout_s,
                "workers": [{"name": w.service.name, **w.service.where()} for w in self.workers]}

    def close(self) -> None:
        for w in self.workers:
            w.service.close()
