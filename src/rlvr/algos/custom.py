"""``custom``: per-token advantages from the user's function (components: ``rl``), or the user's own
:class:`~rlvr.algos.Algorithm` subclass (:func:`user_algorithm`).

``algo.import_path`` names ``fn(inputs, **algo.kwargs) -> list[list[float]]``: one list per
rollout of the group, aligned with that rollout's completion tokens (``inputs.completion_lengths``).
``inputs.broadcast(values)`` spreads one number per rollout over its tokens, for uniform credit.
A return of the wrong shape, or a non-finite value, stops the run naming the row: a stream is
never trimmed, padded or zeroed to fit.

When ``algo.import_path`` names a class instead, it must subclass :class:`~rlvr.algos.Algorithm`
(``name``, ``components`` among ``rl`` / ``ce`` / ``ref_kl``, and ``assign``; ``score`` and
``finalize`` optional) and is built as ``Cls(**algo.kwargs)``: the whole algorithm is the user's,
run through the same hooks as the built-in ones.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from rlvr.algos.base import Algorithm, Samples, broadcast, checked_stream
from rlvr.errors import ConfigError, RLLoopError
from rlvr.types import Group, Rollout, Task


@dataclass(frozen=True, slots=True)
class AdvantageInputs:
    """What a custom advantage function receives for one group."""

    task: Task  # the row
    rollouts: tuple[Rollout, ...]  # scored (an episode's segments are consecutive)
    rewards: tuple[float, ...]  # one per rollout
    completion_lengths: tuple[int, ...]  # one per rollout
    sample_of: tuple[int, ...]  # the sample each rollout belongs to

    def broadcast(self, values: Sequence[float]) -> list[list[float]]:
        """One number per rollout, spread over its trainable tokens."""
        return [list(broadcast(r, v)) for r, v in zip(self.rollouts, values, strict=True)]


class Custom(Algorithm):
    name: ClassVar[str] = "custom"
    components: ClassVar[tuple[str, ...]] = ("rl",)

    def __init__(self, fn: Callable[..., Any], import_path: str, kwargs: dict[str, Any] | None = None):
        self.fn, self.import_path, self.kwargs = fn, import_path, dict(kwargs or {})

    def assign(self, task: Task, samples: Samples) -> Group:
        rollouts = tuple(r for sample in samples for r in sample)
        inputs = AdvantageInputs(task, rollouts, tuple(float(r.reward) for r in rollouts),  # type: ignore[arg-type]
                                 tuple(len(r.completion_ids) for r in rollouts),
                                 tuple(i for i, sample in enumerate(samples) for _ in sample))
        where = f"row {task.id!r}: algo.import_path {self.import_path!r}"
        out = self.fn(inputs, **self.kwargs)
        if not isinstance(out, (list, tuple)) or len(out) != len(rollouts):
            raise RLLoopError(f"{where} must return one list of per-token advantages per rollout "
                              f"({len(rollouts)}), got {out!r:.120}")
        credited = tuple(dataclasses.replace(r, advantages=checked_stream(a, r, f"advantages of rollout {i}", where))
                         for i, (r, a) in enumerate(zip(rollouts, out, strict=True)))
        return Group(task, credited)

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "import_path": self.import_path, "kwargs": self.kwargs}


COMPONENTS = ("rl", "ce", "ref_kl")


def user_algorithm(cls: type, import_path: str, kwargs: dict[str, Any], where: str = "algo") -> Algorithm:
    """``cls(**kwargs)``, checked to be an algorithm the stream and the trainer can run: a subclass of
    :class:`Algorithm` with a ``name`` and ``components`` among ``rl``, ``ce``, ``ref_kl``, that
    overrides ``assign``. Anything else is a :class:`ConfigError` naming ``where.import_path``."""
    field = f"{where}.import_path={import_path!r}"
    if not (isinstance(cls, type) and issubclass(cls, Algorithm)):
        raise ConfigError(f"{field} names {cls!r}, which is not a subclass of rlvr.algos.Algorithm")
    name, components = getattr(cls, "name", None), getattr(cls, "components", None)
    if not isinstance(name, str) or not name:
        raise ConfigError(f"{field}: {cls.__name__} must set the class attribute name = '...' (it names the "
                          "algorithm in the record)")
    if not isinstance(components, tuple) or not components or not set(components) <= set(COMPONENTS):
        raise ConfigError(f"{field}: {cls.__name__}.components = {components!r} must be a non-empty tuple of "
                          f"{list(COMPONENTS)}")
    if cls.assign is Algorithm.assign:
        raise ConfigError(f"{field}: {cls.__name__} must override assign(task, samples) -> Group")
    try:
        algorithm = cls(**kwargs)
    except TypeError as exc:
        raise ConfigError(f"{field}: {cls.__name__}(**{where}.kwargs) failed: {exc}") from None
    algorithm.import_path = import_path
    return algorithm
