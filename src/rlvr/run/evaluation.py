"""Held-out evaluation by sampling: score each held-out task's completion with the reward.

Greedy (temperature 0) by default, so a held-out score is a property of the weights rather than
of a sampling draw. :class:`SamplingEvaluator` works over any sampler with the ``(tasks, k)``
shape; :class:`RolloutEvaluator` over any rollout function (multi-turn included), so held-out
episodes are played exactly as training ones. A reward that raises or returns a non-number on
held-out stops the run: a held-out score is never computed around a broken reward.
Progress: an evaluator tells :func:`row_done` as each row is played, and the loop, which binds a
counter around each evaluation (:func:`counting_rows`), shows rows done / total on the live display,
so a long step-0 evaluation on a slow machine is seen moving. An evaluator that never tells (a user's
own) only shows no row count. Standard library only; the sampler it wraps carries the heavy imports.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

from rlvr.config import GRPOConfig
from rlvr.errors import AbortedError, RewardError, RLLoopError
from rlvr.protocols import RewardFn, RolloutFn, Sampler
from rlvr.reward import evaluate_reward_within
from rlvr.rollouts.checks import check_rollout, check_shape, score
from rlvr.rollouts.clock import bounded
from rlvr.seeding import derive_seed
from rlvr.types import EvalReport, RolloutRequest, Task

# The loop's defaults, so an evaluator built by hand is bounded as a run's is.
ROLLOUT_TIMEOUT_S = GRPOConfig.model_fields["rollout_timeout_s"].default
REWARD_TIMEOUT_S = GRPOConfig.model_fields["reward_timeout_s"].default

_ROW_DONE: ContextVar[Callable[[], None] | None] = ContextVar("rlvr_eval_row_done", default=None)


@contextmanager
def counting_rows(on_row: Callable[[], None]) -> Iterator[None]:
    """Call ``on_row()`` for every row an evaluator run inside the block reports played."""
    token = _ROW_DONE.set(on_row)
    try:
        yield
    finally:
        _ROW_DONE.reset(token)


def row_done(n: int = 1) -> None:
    """Tell whoever counts this evaluation's rows that ``n`` more were played (nobody: nothing)."""
    on_row = _ROW_DONE.get()
    if on_row is not None:
        for _ in range(n):
            on_row()


class SamplingEvaluator:
    """``(step, tasks) -> EvalReport``: mean reward of one completion per task."""

    def __init__(self, sampler: Sampler, reward_fn: RewardFn, *, reward_timeout_s: float | None = REWARD_TIMEOUT_S):
        self.sampler, self.reward_fn, self.reward_timeout_s = sampler, reward_fn, reward_timeout_s

    def __call__(self, step: int, tasks: Sequence[Task]) -> EvalReport:
        groups = self.sampler(tasks, 1)
        row_done(len(tasks))
        check_shape(step, tasks, groups, 1)
        for t, g in zip(tasks, groups, strict=True):
            check_rollout(g[0], t)
        per_task = {t.id: score(g[0], t, self.reward_fn, self.reward_timeout_s).reward or 0.0
                    for t, g in zip(tasks, groups, strict=True)}
        return EvalReport(step=step, score=math.fsum(per_task.values()) / len(per_task), n=len(per_task),
                          per_task=per_task)

    def describe(self) -> dict[str, Any]:
        inner = getattr(self.sampler, "describe", None)
        return {"type": "rlvr.run.evaluation.SamplingEvaluator", "sampler": inner() if inner else None}


class RolloutEvaluator:
    """``(step, tasks) -> EvalReport``: one episode per task through ``rollout_fn``, scored by
    ``reward`` (or by the reward the episode's last rollout carries, as training reads it: an
    agent's or a hub environment's own score). A task whose rollout returns ``None`` scores 0; a
    reward of ``None`` ("does not apply") leaves the task out of the mean, and ``n`` says how many
    counted."""

    def __init__(self, rollout_fn: RolloutFn, reward: Any, *, seed: int = 0,
                 rollout_timeout_s: float | None = ROLLOUT_TIMEOUT_S,
                 reward_timeout_s: float | None = REWARD_TIMEOUT_S):
        self.rollout_fn, self.reward, self.seed = rollout_fn, reward, seed
        self.rollout_timeout_s, self.reward_timeout_s = rollout_timeout_s, reward_timeout_s

    def __call__(self, step: int, tasks: Sequence[Task]) -> EvalReport:
        outs = asyncio.run(self._play(tasks, step))
        per_task: dict[str, float] = {}
        for task, out in zip(tasks, outs, strict=True):
            if isinstance(out, AbortedError):
                raise out
            if isinstance(out, BaseException):
                raise RLLoopError(f"held-out task {task.id!r}: rollout raised {type(out).__name__}: {out}") from out
            last = out[-1] if isinstance(out, (list, tuple)) else out
            if last is None:
                per_task[task.id] = 0.0
                continue
            # A rollout that scored itself (an agent or hub environment's own reward) is read as in training.
            reward = self.reward if last.reward is None else (lambda _m, _a, given=last.reward: given)
            try:
                value = evaluate_reward_within(reward, list(last.messages), task.answer,
                                               self.reward_timeout_s, task).value
            except RewardError as exc:
                raise RLLoopError(f"held-out task {task.id!r}: {exc} (on_sample_error never drops held-out "
                                  "samples: a held-out score is not computed around a broken one)") from exc
            if value is not None:
                per_task[task.id] = value
        if not per_task:
            raise RLLoopError(f"step {step}: the reward applied to none of the {len(tasks)} held-out tasks")
        return EvalReport(step=step, score=math.fsum(per_task.values()) / len(per_task), n=len(per_task),
                          per_task=per_task)

    async def _play(self, tasks: Sequence[Task], step: int) -> list[Any]:
        # Seeds depend on the task's content only: the same weights give the same held-out score,
        # whatever the rows are called.
        requests = [RolloutRequest(t, 0, step, derive_seed(self.seed, "heldout", t.content_hash)) for t in tasks]
        play = bounded(self.rollout_fn, self.rollout_timeout_s)

        async def counted(request: RolloutRequest) -> Any:
            try:
                return await play(request)
            finally:
                row_done()

        return list(await asyncio.gather(*(counted(r) for r in requests), return_exceptions=True))

    def describe(self) -> dict[str, Any]:
        return {"type": "rlvr.run.evaluation.RolloutEvaluator",
                "rollout_fn": getattr(self.rollout_fn, "__qualname__", "?")}


ROWS_SHOWN_EVERY_S = 0.5  # an evaluation's row count is redrawn at most this often


def evaluate_shown(heldout_eval: Callable[[int, list[Task]], float | EvalReport], step: int, tasks: Sequence[Task],
                   show: Callable[[tuple[int, int]], None]) -> EvalReport:
    """``heldout_eval`` over ``tasks`` at ``step``, its rows (done, total) handed to ``show`` as they
    are played (at most every ``ROWS_SHOWN_EVERY_S``, and the last), so a long evaluation is seen moving."""
    total, done, shown = len(tasks), 0, time.monotonic()

    def on_row() -> None:
        nonlocal done, shown
        done += 1
        if done == total or time.monotonic() - shown >= ROWS_SHOWN_EVERY_S:
            shown = time.monotonic()
            show((done, total))

    show((0, total))
    with counting_rows(on_row):
        return eval_report(step, heldout_eval(step, list(tasks)))


def eval_report(step: int, result: float | EvalReport) -> EvalReport:
    """Normalise an evaluator's return value."""
    if isinstance(result, EvalReport):
        report = result
    elif isinstance(result, (int, float)) and not isinstance(result, bool):
        report = EvalReport(step=step, score=float(result))
    else:
        raise RLLoopError(f"heldout_eval must return a float or EvalReport, got {type(result).__name__}")
    if not math.isfinite(report.score):
        raise RLLoopError(f"heldout_eval returned a non-finite score ({report.score}) at step {step}")
    return report


class EnvsEvaluator:
    """``(step, tasks) -> EvalReport`` for a run of several environments: each task is played by its
    environment's evaluator (by :attr:`~rlvr.types.Task.env`); the score is the mean over every
    task that counted, so each environment weighs by its share of the held-out split, and
    ``per_task`` lets the loop report each environment's own score."""

    def __init__(self, evaluators: dict[str, Any]):
        self.evaluators = dict(evaluators)

    def __call__(self, step: int, tasks: Sequence[Task]) -> EvalReport:
        per_task: dict[str, float] = {}
        for name, evaluator in self.evaluators.items():
            mine = [t for t in tasks if t.env == name]
            if mine:
                report = evaluator(step, mine)
                if report.per_task is None:
                    raise RLLoopError(f"held-out evaluator of environment {name!r} gave no per-task scores")
                per_task.update(report.per_task)
        unknown = sorted({str(t.env) for t in tasks} - set(self.evaluators))
        if unknown:
            raise RLLoopError(f"held-out tasks of environments {unknown} have no evaluator")
        return EvalReport(step=step, score=math.fsum(per_task.values()) / len(per_task), n=len(per_task),
                          per_task=per_task)

    def describe(self) -> dict[str, Any]:
        return {"type": "rlvr.run.evaluation.EnvsEvaluator",
                "envs": {k: getattr(v, "describe", lambda: None)() for k, v in self.evaluators.items()}}
