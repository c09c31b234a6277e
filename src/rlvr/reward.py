"""Rewards: what a reward function may return and how the loop reads it.

A reward function is ``reward_fn(messages, answer)``: ``messages`` is the whole conversation
(prompt and the model's turns, OpenAI-style dicts), ``answer`` the row's answer. To see the rest of
the row, it may take a third parameter, ``reward_fn(messages, answer, info)`` (the row's ``info``:
with ``task.fields``, every column but the prompt's), or keywords, ``reward_fn(messages, answer,
**row)`` (``info``'s entries as keywords, but those named like its own parameters). The form is read
from the signature (:func:`reward_form`). It returns

- a ``float`` (an ``int`` or any real number but ``bool`` is accepted and converted);
- a :class:`Score`: named components, some paid (weight != 0), some only recorded (weight 0);
- ``None``: the reward does not apply to this rollout (the loop decides whether to drop it).

:func:`evaluate_reward` calls one and converts what it returns, raising
:class:`~rlvr.errors.RewardError` (and nothing else) when that is not a reward. Whether a bad
reward fails the run or drops the rollout is the loop's decision, not this module's.
Standard library only; environments (:mod:`rlvr.envs`) build on this module, never the reverse.
"""

from __future__ import annotations

import inspect
import math
import numbers
import queue
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from rlvr.errors import RewardError, RLLoopError, exception_at, exception_text, safe_repr
from rlvr.protocols import LoadedEnv, RewardFn
from rlvr.types import Message, Score, Task

__all__ = ["MAX_REWARD", "RewardResult", "Score", "call_reward", "evaluate_reward", "evaluate_reward_within",
           "evaluate_rewards_within",
           "label_of", "name_of", "reward_callable", "reward_form"]

MAX_REWARD = 1e9  # beyond this, squaring rewards for group statistics loses precision and then overflows


@dataclass(frozen=True, slots=True)
class RewardResult:
    """What one reward call gave: ``value`` (``None`` = does not apply) and its metrics."""

    value: float | None
    metrics: dict[str, float] = field(default_factory=dict)

    @property
    def applies(self) -> bool:
        return self.value is not None


def evaluate_reward(env: Any, messages: Sequence[Message], answer: Any, row: Task | None = None) -> RewardResult:
    """Call ``env``'s reward function on one conversation (and its ``row``'s ``info``, for a reward
    that takes it: see :func:`reward_form`) and read what it returns.

    ``env`` is a :class:`LoadedEnv`, an object with ``reward_fn`` or a bare reward function.
    A float or int (not ``bool``) becomes the value; a :class:`Score` gives its value and its
    components as metrics; ``None`` gives ``RewardResult(None)``. Everything else (``bool``, NaN,
    infinities, strings, other objects) and every ``Exception`` the reward function raises becomes
    a :class:`RewardError` naming the environment and the value or exception; nothing else escapes
    (``KeyboardInterrupt`` and friends do propagate). This helper never decides to fail or drop.
    """
    name = _env_name(env)
    try:
        fn = env.reward_fn if isinstance(env, LoadedEnv) else getattr(env, "reward_fn", env)
    except Exception as exc:
        raise RewardError(f"environment {name}: reading reward_fn raised {exception_text(exc)}") from exc
    if not callable(fn):
        raise RewardError(f"environment {name}: reward_fn is {safe_repr(fn)}, not a function")
    try:
        out = call_reward(fn, messages, answer, row)
    except Exception as exc:
        raise RewardError(f"reward_fn of {name} raised {exception_at(exc)}") from exc
    try:
        return _read_reward(out, name)
    except RewardError:
        raise
    except Exception as exc:
        raise RewardError(f"reward_fn of {name} returned {safe_repr(out)} ({type(out).__name__}), which could not "
                          f"be read as a reward: {exception_text(exc)}") from exc


def _read_reward(out: Any, name: str) -> RewardResult:
    if out is None:
        return RewardResult(None, {})
    if isinstance(out, Score):
        value = out.value
        metrics = out.metrics
        if not math.isfinite(value):
            raise RewardError(f"reward_fn of {name} returned a Score whose value is {value} "
                              f"(components {metrics}, weights {dict(out.weights)}); expected a finite value")
        return RewardResult(_bounded(value, name), metrics)
    if isinstance(out, bool):
        raise RewardError(f"reward_fn of {name} returned {out!r} (bool); return a float such as "
                          f"{float(out)} instead, so a predicate is never mistaken for a reward")
    if isinstance(out, numbers.Real):
        value = float(out)
        if not math.isfinite(value):
            raise RewardError(f"reward_fn of {name} returned {safe_repr(out)} ({type(out).__name__}); "
                              "expected a finite float")
        return RewardResult(_bounded(value, name), {})
    raise RewardError(f"reward_fn of {name} returned {safe_repr(out)} ({type(out).__name__}); "
                      "expected a float, a Score or None")


def _bounded(value: float, name: str) -> float:
    if abs(value) > MAX_REWARD:
        raise RewardError(f"reward_fn of {name} returned {value:g}, beyond ±{MAX_REWARD:g}: advantages square "
                          "rewards, so rewards this large overflow; scale the reward down")
    return value


def evaluate_reward_within(env: Any, messages: Sequence[Message], answer: Any,
                           timeout_s: float | None, row: Task | None = None) -> RewardResult:
    """:func:`evaluate_reward` bounded by ``timeout_s`` seconds (``None``: unbounded). The reward runs
    in a worker thread; one that has not returned by then becomes a :class:`RewardError` naming the
    bound, and its thread is abandoned (Python cannot kill a thread: a reward that may hang should
    do its slow work in a process of its own, as the math grader does). ``SystemExit`` and
    ``KeyboardInterrupt`` raised by the reward reach the caller as they are. A reward function
    marked ``bounds_itself`` (reward workers, :mod:`rlvr.envs.workers`) enforces the bound itself,
    where it can kill what overran, and gets no thread of its own."""
    outcome = evaluate_rewards_within([(env, messages, answer, row)], timeout_s)[0]
    if isinstance(outcome, RewardError):
        raise outcome
    return outcome


RewardCall = tuple[Any, Sequence[Message], Any, "Task | None"]  # (env, messages, answer, row)


def evaluate_rewards_within(calls: Sequence[RewardCall],
                            timeout_s: float | None) -> list[RewardResult | RewardError]:
    """:func:`evaluate_reward_within` for several conversations (a group's samples), in order, with one
    thread hand-off for them all rather than one per reward: for a reward of microseconds, the
    hand-off is the cost. Each reward is still bounded by ``timeout_s`` from its own start; one that
    overruns gets a :class:`RewardError` (its thread abandoned) and the rest run on another thread.
    Returns each call's result or the :class:`RewardError` it raised; ``SystemExit`` and
    ``KeyboardInterrupt`` propagate as they are."""
    outcomes: list[RewardResult | RewardError | None] = [None] * len(calls)
    threaded = []
    for i, call in enumerate(calls):
        if timeout_s is None or _bounds_itself(call[0]):
            outcomes[i] = _outcome(call)  # nothing to bound here: no hand-off at all
        else:
            threaded.append(i)
    while threaded and timeout_s is not None:  # (only calls with a bound were threaded)
        done, overran = _THREADS.run([calls[i] for i in threaded], timeout_s)
        for i, outcome in zip(threaded, done, strict=False):
            outcomes[i] = outcome
        if overran:  # the call after the last done one: its thread is abandoned, the rest go to another
            i = threaded[len(done)]
            outcomes[i] = RewardError(f"reward_fn of {_env_name(calls[i][0])} did not return within "
                                      f"reward_timeout_s={timeout_s:g}s")
        threaded = threaded[len(done) + overran:]
    return outcomes  # type: ignore[return-value]


def _bounds_itself(env: Any) -> bool:
    try:
        fn = env.reward_fn if isinstance(env, LoadedEnv) else getattr(env, "reward_fn", env)
    except Exception:  # noqa: BLE001 - evaluate_reward names this failure
        return False
    return getattr(fn, "bounds_itself", False) is True


def _outcome(call: RewardCall) -> RewardResult | RewardError:
    try:
        return evaluate_reward(*call)
    except RewardError as exc:
        return exc


class _RewardThreads:
    """Reward threads kept between calls: a thread is started only when none is idle, so scoring a
    reward costs a hand-off, not a thread's start. A thread whose reward overran is abandoned: it
    starts no further call, exits if that reward ever returns, and is never handed work again."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self._idle: list[_RewardThread] = []

    def run(self, calls: Sequence[RewardCall], timeout_s: float) -> tuple[list[RewardResult | RewardError], bool]:
        """The outcomes of ``calls``, in order, as far as they got, and whether the next one overran
        ``timeout_s`` from its start (otherwise the calls not done were never started)."""
        with self.lock:
            thread = self._idle.pop() if self._idle else None
        thread = thread or _RewardThread(self)
        job = _Job(calls)
        thread.jobs.put(job)
        done: list[RewardResult | RewardError] = []
        while len(done) < len(calls):
            try:
                arrived = [job.results.get(timeout=timeout_s)]
            except queue.Empty:
                arrived = []
            if not arrived:
                with self.lock:
                    thread.abandoned = True  # it starts nothing more
                    started = job.started
                arrived = _drain(job.results)  # what came back since the wait gave up
            for kind, value in arrived:
                if kind == "raise":
                    raise value  # SystemExit, KeyboardInterrupt: the caller's to handle
                done.append(value)
            if thread.abandoned:
                if len(done) == started:  # all it started are back: the rest were never started
                    return done, False
                if not arrived:  # the call it is running overran
                    return done, True
                # the one waited for returned just late and the next had started: wait for that one
        return done, False

    def idle(self, thread: _RewardThread) -> bool:
        """Put a thread that finished its calls back, unless it was abandoned (then it exits)."""
        with self.lock:
            if thread.abandoned:
                return False
            self._idle.append(thread)
            return True


class _Job:
    def __init__(self, calls: Sequence[RewardCall]):
        self.calls, self.started = calls, 0
        self.results: queue.SimpleQueue = queue.SimpleQueue()


def _drain(results: queue.SimpleQueue) -> list[tuple[str, Any]]:
    out = []
    while True:
        try:
            out.append(results.get_nowait())
        except queue.Empty:
            return out


class _RewardThread:
    def __init__(self, owner: _RewardThreads):
        self.owner, self.abandoned = owner, False
        self.jobs: queue.SimpleQueue = queue.SimpleQueue()
        threading.Thread(target=self._serve, name="rlvr-reward", daemon=True).start()

    def _serve(self) -> None:
        while True:
            job: _Job = self.jobs.get()
            for call in job.calls:
                with self.owner.lock:
                    if self.abandoned:
                        break
                    job.started += 1
                try:
                    job.results.put(("result", _outcome(call)))
                except BaseException as exc:  # noqa: BLE001 - SystemExit and friends go to the caller
                    job.results.put(("raise", exc))
                    break
            if not self.owner.idle(self):
                return


_THREADS = _RewardThreads()


def reward_form(fn: Any) -> str:
    """How ``fn`` is called: ``"task"`` (an adapter marked ``takes_task = True``, such as the TRL one:
    ``fn(messages, answer, task)``), ``"info"`` (a third positional parameter without a default, or one
    named ``info``: ``fn(messages, answer, info)``), ``"row"`` (``**kwargs``: ``fn(messages, answer,
    **info)``) or ``"plain"`` (``fn(messages, answer)``; also when the signature cannot be read)."""
    if getattr(fn, "takes_task", False) is True:
        return "task"
    try:
        parameters = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return "plain"
    positional = [p for p in parameters if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    if len(positional) >= 3 and (positional[2].default is inspect.Parameter.empty or positional[2].name == "info"):
        return "info"
    if any(p.kind is p.VAR_KEYWORD for p in parameters):
        return "row"
    return "plain"


def call_reward(fn: Any, messages: Sequence[Message], answer: Any, row: Task | None) -> Any:
    """``fn`` called in its :func:`reward_form`, with ``row``'s info (``{}`` without a row)."""
    form = reward_form(fn)
    if form == "task":
        return fn(messages, answer, row)
    info = dict(row.info) if row is not None else {}
    if form == "info":
        return fn(messages, answer, info)
    if form == "row":
        # Only the two parameters filled positionally are out of reach: every other column, named
        # parameters included, goes in by keyword.
        first_two = [p.name for p in inspect.signature(fn).parameters.values()
                     if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)][:2]
        return fn(messages, answer, **{k: v for k, v in info.items() if k not in first_two})
    return fn(messages, answer)


def _env_name(env: Any) -> str:
    try:
        if isinstance(env, LoadedEnv):
            return repr(env.name)
        return repr(name_of(env, label_of(env)))
    except Exception:  # noqa: BLE001 - any failure becomes a named error
        return "<environment>"




def name_of(obj: Any, fallback: str) -> str:
    for attr in ("name", "NAME"):
        value = getattr(obj, attr, None)
        if isinstance(value, str) and value:
            return value
    if inspect.ismodule(obj):
        return obj.__name__.rpartition(".")[2]
    qualname = getattr(obj, "__qualname__", None)
    if isinstance(qualname, str) and not inspect.isclass(obj) and callable(obj) and inspect.isroutine(obj):
        return qualname.rpartition("<locals>.")[2]
    kind = type(obj).__name__
    return kind if kind not in ("function", "partial") else fallback



def label_of(obj: Any) -> str:
    try:
        if inspect.ismodule(obj):
            return obj.__name__
        return getattr(obj, "__qualname__", None) or type(obj).__qualname__
    except Exception:  # noqa: BLE001 - any failure becomes a named error
        return "<environment>"


def reward_callable(reward: Any) -> RewardFn:
    """The ``reward_fn(messages, answer)`` of a plain callable or of an environment object."""
    fn = getattr(reward, "reward_fn", reward)
    if not callable(fn):
        raise RLLoopError("reward must be a callable reward_fn(messages, answer) or have a reward_fn")
    return fn
