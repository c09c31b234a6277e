"""A reward function served by a few cluster actors, each call bounded: :class:`ActorRewardPool`.

The same seam as :class:`~rlvr.envs.workers.RewardWorkers` (``takes_task``: called ``(messages,
answer, row)``; ``bounds_itself``), over *slots*: each slot is one actor of a cluster engine (Ray,
:mod:`rlvr.backends.cluster.ray_rewards`) that the engine places, watches and restarts. This module
holds the policy only, so it is tested with fake slots:

- a call waits for a free slot, then at most ``timeout_s`` for its answer; a slot that has not
  answered by then is restarted by the engine (:meth:`Slot.restart`) and the call raises
  :class:`~rlvr.errors.RewardError` naming the row (a sample error the stream counts or fails on);
- an actor that died and that the engine brought back by itself (its process id changed between
  two answers: the engine restarted it and retried the call) is recorded, never hidden;
- an actor that is gone for good (:class:`~rlvr.errors.ActorLost`: killed without restart, restarts spent) is
  replaced by a new one (:meth:`Slot.replace`) and the call tried once more on it; a second death
  is a :class:`RewardError` naming the row;
- every restart and replacement is a printed line and a ``warning`` for the run record
  (:meth:`ActorRewardPool.take_warnings`), naming the actor, its node and why.

Standard library only.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from rlvr.errors import ActorLost, ActorTimeout, ConfigError, RewardError
from rlvr.types import Message, Task


class Slot(Protocol):
    """One reward actor. ``call`` returns ``(kind, body, pid)``: ``("ok", reward result)`` or
    ``("raised", exception text)``, and the id of the process that answered."""

    name: str

    def call(self, payload: tuple[Any, Any, Any], timeout_s: float | None) -> tuple[str, Any, int]: ...

    def restart(self) -> None: ...

    def replace(self) -> Slot: ...

    def where(self) -> dict[str, Any]: ...

    def kill(self) -> None: ...


class ActorRewardPool:
    """A reward function over ``slots``; see the module docstring."""

    takes_task = True  # called (messages, answer, row): the row's id names a failed call
    bounds_itself = True

    def __init__(self, slots: Sequence[Slot], *, timeout_s: float | None, env_name: str = "reward",
                 engine: str = "ray", log: Callable[[str], None] = print):
        if not slots:
            raise ConfigError("a reward worker pool needs at least one worker: set task.reward_workers >= 1")
        self.timeout_s, self.name, self.engine, self.log = timeout_s, env_name, engine, log
        self._lock = threading.Lock()
        self._idle: queue.Queue[Slot] = queue.Queue()
        self._slots: list[Slot] = list(slots)
        self._pids: dict[int, int | None] = {id(s): s.where().get("pid") for s in slots}
        self._warnings: list[dict[str, Any]] = []
        self.calls = self.timeouts = self.restarted = self.replaced = 0
        for slot in slots:
            self._idle.put(slot)

    def __call__(self, messages: Sequence[Message], answer: Any, row: Task | None = None) -> Any:
        where = f"row {row.id!r}" if row is not None else "a conversation"
        payload = (list(messages), answer, row)
        with self._lock:
            self.calls += 1
        for attempt in (1, 2):
            slot = self._free(where)
            try:
                kind, body, pid = slot.call(payload, self.timeout_s)
            except ActorTimeout:
                self._restart(slot, where)
                raise RewardError(f"reward of {self.name!r} on {where} did not return within "
                                  f"reward_timeout_s={self.timeout_s:g}s; its worker ({slot.name}) was restarted "
                                  f"by {self.engine}") from None
            except ActorLost as exc:
                self._replace(slot, str(exc), where)
                if attempt == 2:
                    raise RewardError(f"reward of {self.name!r} on {where}: its worker died twice (last: {exc}); "
                                      "the reward crashes its process on this row") from None
                continue
            except BaseException:
                self._idle.put(slot)
                raise
            self._seen(slot, pid, where)
            self._idle.put(slot)
            if kind == "raised":
                raise RewardError(f"reward of {self.name!r} on {where} raised {body}")
            return body
        raise AssertionError("unreachable")

    def _free(self, where: str) -> Slot:
        """The next idle slot; a :class:`RewardError` once no actor is left (every replacement failed)."""
        while True:
            try:
                return self._idle.get(timeout=1.0)
            except queue.Empty:
                with self._lock:
                    left = len(self._slots)
                if not left:
                    raise RewardError(f"reward of {self.name!r} on {where}: no reward worker is left (each "
                                      "replacement failed; see the warnings above)") from None

    def _seen(self, slot: Slot, pid: int, where: str) -> None:
        """An answer from a process other than the last one: the engine restarted the actor."""
        with self._lock:
            before, self._pids[id(slot)] = self._pids.get(id(slot)), pid
        if before is not None and before != pid:
            with self._lock:
                self.restarted += 1
            self._warn("reward_worker_restarted", slot, f"its process {before} died; {self.engine} restarted "
                       f"it as process {pid} and retried the call on {where}")

    def _restart(self, slot: Slot, where: str) -> None:
        with self._lock:
            self.timeouts += 1
        slot.restart()
        with self._lock:
            self._pids[id(slot)] = None  # the restarted process answers next: not a death of its own
        self._warn("reward_worker_timeout", slot, f"no answer on {where} within {self.timeout_s:g}s; restarted")
        self._idle.put(slot)

    def _replace(self, slot: Slot, why: str, where: str) -> None:
        try:
            new = slot.replace()
        except BaseException:
            with self._lock:
                if slot in self._slots:
                    self._slots.remove(slot)
            raise
        with self._lock:
            if slot in self._slots:  # else the pool was closed meanwhile
                self._slots[self._slots.index(slot)] = new
            self._pids.pop(id(slot), None)
            self._pids[id(new)] = new.where().get("pid")
            self.replaced += 1
        self._warn("reward_worker_replaced", slot, f"{why}; replaced by {new.name} during the call on {where}",
                   replacement=new.where())
        self._idle.put(new)

    def _warn(self, kind: str, slot: Slot, reason: str, **extra: Any) -> None:
        warning = {"warning": kind, "worker": slot.name, "node": slot.where(), "reason": reason, **extra}
        with self._lock:
            self._warnings.append(warning)
        self.log(f"reward workers: {slot.name} {reason}")

    def take_warnings(self) -> list[dict[str, Any]]:
        """Restarts and replacements since the last call, for the run record's warning events."""
        with self._lock:
            out, self._warnings = self._warnings, []
        return out

    def actors(self) -> list[dict[str, Any]]:
        with self._lock:
            return [slot.where() for slot in self._slots]

    def close(self) -> None:
        """Stop every actor; idempotent."""
        with self._lock:
            slots, self._slots = self._slots, []
        for slot in slots:
            slot.kill()

    def describe(self) -> dict[str, Any]:
        return {"type": f"{__name__}.{type(self).__name__}", "engine": self.engine, "workers": len(self._slots),
                "timeout_s": self.timeout_s, "env": self.name, "calls": self.calls, "timeouts": self.timeouts,
                "restarted": self.restarted, "replaced": self.replaced, "actors": self.actors()}
