"""Rows, samples and outcomes as JSON-ready values, for rollout workers in other processes.

What crosses to a worker is a row (:class:`~rlvr.types.Task`), the policy version it was admitted
under and its samples' seeds; what comes back is one outcome per sample: a
:class:`~rlvr.types.Rollout`, an episode's segments, ``None`` (dropped) or the exception the sample
raised. Decoding gives back exactly what was encoded: tuples where the carriers hold tuples, the
same floats (JSON writes a float's shortest exact form), the same stop reason; an exception comes
back as its own class when this process has it (a built-in, or one of :mod:`rlvr.errors`), else as a
:class:`~rlvr.errors.RemoteRolloutError` subclass of the same name, with the same message, so a
dropped sample's reason reads as it would have locally. ``SystemExit``/``KeyboardInterrupt`` in the
worker's user code come back as :class:`~rlvr.errors.AbortedError`: the run stops, as it would have.

Standard library only.
"""

from __future__ import annotations

import builtins
import dataclasses
from typing import Any

from rlvr import errors
from rlvr.errors import AbortedError, RemoteRolloutError
from rlvr.rollouts.remote import RowJob
from rlvr.types import Rollout, StopReason, Task

_TUPLES = ("prompt_ids", "completion_ids", "logprobs", "loss_mask", "advantages", "rl_weights", "ce_weights",
           "ref_kl_weights", "ref_logprobs", "token_roles")


def task_to_wire(task: Task) -> dict[str, Any]:
    return {"id": task.id, "messages": [dict(m) for m in task.messages], "answer": task.answer,
            "content_hash": task.content_hash, "info": dict(task.info), "env": task.env,
            "conversational": task.conversational}


def task_from_wire(data: dict[str, Any]) -> Task:
    return Task(id=data["id"], messages=tuple(dict(m) for m in data["messages"]), answer=data["answer"],
                content_hash=data["content_hash"], info=dict(data.get("info") or {}), env=data.get("env"),
                conversational=bool(data.get("conversational", True)))


def rollout_to_wire(rollout: Rollout) -> dict[str, Any]:
    data = {f.name: getattr(rollout, f.name) for f in dataclasses.fields(rollout)}
    for name in _TUPLES:
        if data[name] is not None:
            data[name] = list(data[name])
    data["messages"] = [dict(m) for m in rollout.messages]
    data["stop_reason"] = str(rollout.stop_reason)
    data["metrics"] = dict(rollout.metrics)
    return data


def rollout_from_wire(data: dict[str, Any]) -> Rollout:
    fields = dict(data)
    for name in _TUPLES:
        if fields.get(name) is not None:
            fields[name] = tuple(fields[name])
    fields["messages"] = tuple(dict(m) for m in fields["messages"])
    fields["stop_reason"] = StopReason(fields["stop_reason"])
    fields["metrics"] = dict(fields.get("metrics") or {})
    return Rollout(**fields)


def outcome_to_wire(outcome: Any) -> dict[str, Any]:
    """One sample's outcome as a JSON-ready value (see the module docstring)."""
    if outcome is None:
        return {"kind": "none"}
    if isinstance(outcome, Rollout):
        return {"kind": "rollout", "rollout": rollout_to_wire(outcome)}
    if isinstance(outcome, (list, tuple)) and all(isinstance(r, Rollout) for r in outcome):
        return {"kind": "segments", "rollouts": [rollout_to_wire(r) for r in outcome]}
    if isinstance(outcome, AbortedError):
        return {"kind": "aborted", "message": str(outcome)}
    if isinstance(outcome, BaseException):
        return {"kind": "raised", "type": type(outcome).__name__, "message": str(outcome)}
    # Anything else is the rollout function's contract broken: the trainer says so, naming what it got.
    return {"kind": "other", "repr": repr(outcome)[:300]}


def outcome_from_wire(data: dict[str, Any]) -> Any:
    kind = data["kind"]
    if kind == "none":
        return None
    if kind == "rollout":
        return rollout_from_wire(data["rollout"])
    if kind == "segments":
        return [rollout_from_wire(r) for r in data["rollouts"]]
    if kind == "aborted":
        return AbortedError(data["message"])
    if kind == "raised":
        return exception_named(data["type"], data["message"])
    if kind == "other":
        return _Unreadable(data["repr"])
    raise ValueError(f"a rollout worker answered an outcome of unknown kind {kind!r}")


@dataclasses.dataclass(frozen=True)
class _Unreadable:
    """What a worker's rollout function returned that is no Rollout: kept as its repr for the error."""

    text: str

    def __repr__(self) -> str:
        return self.text


_REMOTE_CLASSES: dict[str, type[RemoteRolloutError]] = {}


def exception_named(name: str, message: str) -> BaseException:
    """An exception of class ``name`` carrying ``message``: the built-in or rlvr class of that name,
    else a :class:`RemoteRolloutError` subclass named ``name``."""
    known = getattr(builtins, name, None) or getattr(errors, name, None)
    if isinstance(known, type) and issubclass(known, Exception):
        try:
            return known(message)
        except TypeError:  # a class whose constructor takes more than a message
            pass
    cls = _REMOTE_CLASSES.get(name)
    if cls is None:
        cls = _REMOTE_CLASSES[name] = type(name, (RemoteRolloutError,), {"__module__": "rlvr.remote"})
    return cls(message)


def job_to_wire(job: RowJob) -> dict[str, Any]:
    return {"task": task_to_wire(job.task), "version": job.version, "seeds": list(job.seeds),
            "sample_timeout_s": job.sample_timeout_s, "servers": [dict(s) for s in job.servers]}


def job_from_wire(data: dict[str, Any]) -> RowJob:
    return RowJob(task_from_wire(data["task"]), int(data["version"]), tuple(int(s) for s in data["seeds"]),
                  data.get("sample_timeout_s"), tuple(dict(s) for s in data.get("servers") or ()))
