"""Every seam the loop calls, as a small Protocol or callable type; users inject plain callables.

- rollout function ``async (RolloutRequest) -> Rollout | list[Rollout] | None``, built once per run
  by ``make_rollout_fn(RolloutSetup)``; it samples through a :class:`Generator` (token in, token out)
  and renders with a :class:`ChatTokenizer`;
- sampler ``(tasks, k) -> list[list[Rollout]]``: the simple form, ``k`` rollouts per task in order;
- trainer ``(batch) -> metrics``: one train step on a :class:`~rlvr.types.Batch`; optional
  ``save(path)`` and ``load(path)`` (:class:`Checkpointable`) make its state part of each checkpoint;
- weight sync ``(version) -> served version | None``, before the first sample and after each step;
- held-out evaluator ``(step, tasks) -> float | EvalReport``;
- reward ``(messages, answer) -> float | Score | None``, or an :class:`Environment` with a
  ``reward_fn``; a :class:`MultiTurnEnvironment` also answers the model through ``interact``;
- dynamic filter ``(group) -> True | False | reason``;
- metric sink (:class:`MetricSink`): where a run's config, per-step scalars and sample completions
  are mirrored beside the run record (TensorBoard, MLflow, W&B; see ``rlvr.backends.track``).

Objects with richer interfaces are welcome as long as they are callable this way. An optional
``describe() -> dict`` on any seam is recorded in run.json. Standard library only.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from rlvr.types import (
    Batch,
    Completion,
    EvalReport,
    Group,
    Message,
    Rollout,
    RolloutRequest,
    SamplingParams,
    Score,
    Task,
)


class Generator(Protocol):
    """Token-in, token-out sampling. Implementations: the in-process engine, the HTTP sampler, fakes."""

    async def generate(self, prompt_ids: Sequence[int], params: SamplingParams, *, seed: int) -> Completion: ...


class ChatTokenizer(Protocol):
    """Messages to prompt ids (chat template, generation prompt added) and ids back to text."""

    def render(self, messages: Sequence[Message]) -> list[int]: ...

    def decode(self, ids: Sequence[int]) -> str: ...


class Scorer(Protocol):
    """Log-probs a model gives to tokens it did not necessarily sample: ``score(prompt_ids,
    completion_ids)`` is ``log p(completion_ids[t] | prompt_ids + completion_ids[:t])`` for every t,
    at temperature 1 (the model's own distribution), one float per completion token. Implementations:
    a frozen OpenAI-compatible endpoint (prompt logprobs), the run's own sampler (the policy), fakes."""

    async def score(self, prompt_ids: Sequence[int], completion_ids: Sequence[int]) -> list[float]: ...


RolloutFn = Callable[[RolloutRequest], Awaitable["Rollout | list[Rollout] | None"]]
"""A sample is one Rollout, or the training segments of one episode (see ``episodes.multi_turn``)."""

SampleOutcome = Rollout | list[Rollout] | BaseException | None
GroupFn = Callable[[Task, int, int, Callable[[int], int]], Awaitable[list[SampleOutcome]]]
"""``(task, k, version, seed_of) -> k outcomes``: a rollout, ``None`` (dropped) or the exception
that sample raised. ``seed_of(index)`` is the seed of sample ``index``."""


class Sampler(Protocol):
    def __call__(self, tasks: Sequence[Task], k: int) -> list[list[Rollout]]: ...


class Trainer(Protocol):
    """One train step on ``batch`` (``batch.rollouts`` and ``batch.advantages`` align one to one).

    A trainer that turns ``token_rewards`` into advantages with a critic says so with a true
    ``has_critic`` attribute; the loop refuses an algorithm that needs one (``loop.advantage =
    'gae'``) with a trainer that has none."""

    def __call__(self, batch: Batch) -> Mapping[str, float]: ...


@runtime_checkable
class Checkpointable(Protocol):
    def save(self, path: str) -> None: ...

    def load(self, path: str) -> None: ...


WeightSync = Callable[[int], "int | None"]
"""``publish(version) -> the version now served`` (``None``: the sampler cannot tell)."""


class HeldoutEvaluator(Protocol):
    def __call__(self, step: int, tasks: Sequence[Task]) -> float | EvalReport: ...


RewardFn = Callable[[list[Message], Any], Any]
"""``reward_fn(messages, answer) -> float | Score | None`` (or ``(messages, answer, info)``, ``(messages,
answer, **row)``: see ``rlvr.reward.reward_form``); read by ``rlvr.reward.evaluate_reward``."""

InteractFn = Callable[[list[Message], dict[str, Any]], list[Message]]

DynamicFilter = Callable[[Group], "bool | str"]
"""``group -> True`` to keep it, ``False`` or a reason string to filter it."""


@runtime_checkable
class Environment(Protocol):
    """A single-turn environment: a reward function and nothing else required."""

    def reward_fn(self, messages: list[Message], answer: Any) -> float | Score | None: ...


@runtime_checkable
class MultiTurnEnvironment(Environment, Protocol):
    """An environment that answers the model: ``interact`` returns the next messages, ``[]`` = done.

    ``interact(messages)`` with one parameter is accepted too (see ``rlvr.envs.loading``).
    """

    def interact(self, messages: list[Message], state: dict[str, Any]) -> list[Message]: ...


@runtime_checkable
class MetricSink(Protocol):
    """A tracker the run record is mirrored to. The recorder calls it where it writes the record:
    ``log_config`` once per session with what run.json holds, ``log_metrics`` with each step's
    scalars (and held-out scores as ``heldout/...``), ``log_samples`` with the rows written to
    ``samples/step_N.jsonl``, ``close`` at the end. An exception disables that sink, not the run."""

    name: str

    def log_config(self, config: Mapping[str, Any]) -> None: ...

    def log_metrics(self, step: int, scalars: Mapping[str, float]) -> None: ...

    def log_samples(self, step: int, rows: Sequence[Mapping[str, Any]]) -> None: ...

    def close(self) -> None: ...


# ---- what a run hands its rollout functions and environments ------------------------------
@dataclass(frozen=True)
class RolloutSetup:
    """What ``make_rollout_fn`` receives, once per run."""

    generator: Generator  # token-in, token-out sampling
    tokenizer: ChatTokenizer  # messages to prompt ids and back
    params: SamplingParams = SamplingParams()  # sampling parameters for training rollouts
    env: Any = None  # the run's environment (a LoadedEnv)
    extras: Mapping[str, Any] = field(default_factory=dict)  # anything else a custom make_rollout_fn needs


@dataclass(frozen=True, slots=True)
class LoadedEnv:
    """An environment, normalised.

    ``reward_fn(messages, answer)`` as the environment wrote it (its return is read by
    :func:`evaluate_reward`); ``interact(messages, state)`` always takes two arguments here (a
    one-parameter ``interact`` is wrapped at load) and checks that it returns a list of messages;
    ``make_rows`` is the environment's own row maker, when it has one.
    """

    name: str  # how messages and records name it
    reward_fn: Callable[..., Any]  # as written, in any shape rlvr.reward.reward_form reads; see evaluate_reward
    interact: InteractFn | None = None  # (messages, state) -> messages; None for single-turn
    make_rows: Callable[..., list[dict[str, Any]]] | None = None  # its own row maker, when it has one
    spec: str | None = None  # what it was loaded from
    source: Any = field(default=None, repr=False, compare=False)  # the object it was built from

    @property
    def multi_turn(self) -> bool:
        return self.interact is not None

    def describe(self) -> dict[str, Any]:
        """What the run record says about this environment."""
        return {"type": "environment", "name": self.name, "spec": self.spec, "multi_turn": self.multi_turn}
