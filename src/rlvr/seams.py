"""The seams the loop calls: plain callables, exactly as users inject them.

- sampler ``(tasks, k) -> list[list[Rollout]]``: ``k`` rollouts per task, in task order.
- trainer ``(rollouts, advantages, step) -> metrics``: one train step; optional ``save(path)``
  and ``load(path)`` methods make its state part of each checkpoint (needed for resume).
- held-out evaluator ``(step, tasks) -> float | EvalReport``.
- reward ``(messages, answer) -> float``, or an object with a ``reward_fn`` attribute.

Objects with richer interfaces are welcome as long as they are callable this way. An optional
``describe() -> dict`` on any seam is recorded in run.json. Standard library only.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

from rlvr.errors import RLLoopError
from rlvr.types import EvalReport, Message, Rollout, Task


class Sampler(Protocol):
    def __call__(self, tasks: Sequence[Task], k: int) -> list[list[Rollout]]: ...


class Trainer(Protocol):
    def __call__(self, rollouts: list[Rollout], advantages: list[float], step: int) -> Mapping[str, float]: ...


@runtime_checkable
class Checkpointable(Protocol):
    def save(self, path: str) -> None: ...

    def load(self, path: str) -> None: ...


class HeldoutEvaluator(Protocol):
    def __call__(self, step: int, tasks: Sequence[Task]) -> float | EvalReport: ...


RewardFn = Callable[[list[Message], Any], float | None]


def reward_callable(reward: Any) -> RewardFn:
    """The ``reward_fn(messages, answer)`` of a plain callable or of an environment object."""
    fn = getattr(reward, "reward_fn", reward)
    if not callable(fn):
        raise RLLoopError("reward must be a callable reward_fn(messages, answer) or have a reward_fn")
    return fn


def describe(seam: Any) -> dict[str, Any]:
    """What the run record says about a seam."""
    custom = getattr(seam, "describe", None)
    if callable(custom):
        return dict(custom())
    kind = seam if callable(seam) and hasattr(seam, "__qualname__") else type(seam)
    return {"type": f"{getattr(kind, '__module__', '?')}.{getattr(kind, '__qualname__', repr(kind))}"}


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
