"""Fakes for the loop's seams, shipped so users can test their rewards, hooks and configs.

- :class:`FakeSampler` answers each task with seeded completions (right with probability
  ``skill(version)``), with byte-level token ids and logprobs.
- :class:`FakeTrainer` bumps the policy version and records what it was given.
- :class:`ScriptedEvaluator` returns a held-out score per step from a function or mapping.
- :class:`FakeChatTokenizer` and :class:`FakeGenerator` stand in for a tokenizer and a sampler
  under the rollout functions of :mod:`rlvr.rollouts.episodes` (multi-turn included).
- :class:`FakeRolloutFn` is the per-sample form of :class:`FakeSampler`: an async rollout
  function that can also sleep a seeded random time, to shuffle completion order in async tests.

Deterministic: every draw is seeded from coordinates. Standard library only.
"""

from __future__ import annotations

import dataclasses
import json
import random
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlvr.algos.base import broadcast
from rlvr.errors import RLLoopError
from rlvr.rollouts.checks import check_credit
from rlvr.seeding import derive_seed, rng_for
from rlvr.types import Batch, EvalReport, Group, Rollout, StopReason, Task


def _ids(text: str) -> tuple[int, ...]:
    return tuple(text.encode())


class FakeSampler:
    """Seeded completions: the task's answer with probability ``skill(version)``, else a wrong one.

    ``policy`` is anything with a ``version`` attribute (a :class:`FakeTrainer`, say); without it,
    rollouts carry no version and the loop stamps its own. Every draw is keyed on what identifies
    the sample, never on call order: the loop passes each sample's seed (derived from the run seed,
    the row, its draw and the sample index) as ``seeds``; called directly, a sample is keyed on
    ``(seed, version, task id, index)``. So concurrent calls in any order draw the same.
    """

    def __init__(self, skill: float | Callable[[int], float] = 0.5, *, policy: Any = None, seed: int = 0):
        self.skill = skill if callable(skill) else (lambda _v, p=float(skill): p)
        self.policy, self.seed = policy, seed
        self.calls = 0  # how many times it was called (counted, never drawn from)
        self._count = threading.Lock()

    def __call__(self, tasks: Sequence[Task], k: int, *,
                 seeds: Sequence[Sequence[int]] | None = None) -> list[list[Rollout]]:
        with self._count:
            self.calls += 1
        version = getattr(self.policy, "version", None)
        p = min(1.0, max(0.0, self.skill(version or 0)))
        if seeds is None:
            seeds = [[derive_seed(self.seed, "fake-sample", version, task.content_hash, i) for i in range(k)]
                     for task in tasks]
        return [[self._one(task, i, version, p, rng_for(self.seed, "fake-sample", s)) for i, s in enumerate(row)]
                for task, row in zip(tasks, seeds, strict=True)]

    def _one(self, task: Task, i: int, version: int | None, p: float, rng: random.Random) -> Rollout:
        right = rng.random() < p
        text = str(task.answer) if right else f"not {task.answer} ({rng.randrange(1000)})"
        completion = _ids(text)
        return Rollout(
            task_id=task.id,
            prompt_ids=_ids("".join(m["content"] for m in task.messages)),
            completion_ids=completion,
            logprobs=tuple(-rng.random() * 2 for _ in completion),
            text=text,
            messages=(*task.messages, {"role": "assistant", "content": text}),
            version=version,
            stop_reason=StopReason.STOP,
        )

    def describe(self) -> dict[str, Any]:
        return {"type": "rlvr.testing.FakeSampler", "seed": self.seed}


class FakeRolloutFn:
    """``async (row) -> Rollout``: FakeSampler's draws, one sample per call, after a seeded delay
    of up to ``max_delay`` seconds. The rollout carries the policy version read when it started."""

    def __init__(self, skill: float | Callable[[int], float] = 0.5, *, policy: Any = None, seed: int = 0,
                 max_delay: float = 0.0):
        self.inner = FakeSampler(skill, policy=policy, seed=seed)
        self.max_delay, self.seed = max_delay, seed

    async def __call__(self, row: Any) -> Rollout:
        import asyncio

        version = getattr(self.inner.policy, "version", None)
        p = min(1.0, max(0.0, self.inner.skill(version or 0)))
        if self.max_delay:
            await asyncio.sleep(rng_for(self.seed, "delay", row.seed).random() * self.max_delay)
        return self.inner._one(row.task, row.index, version, p, rng_for(self.seed, "fake-sample", row.seed))

    def describe(self) -> dict[str, Any]:
        return {"type": "rlvr.testing.FakeRolloutFn", "seed": self.seed, "max_delay": self.max_delay}


def batch_of(rollouts: Sequence[Rollout], advantages: Sequence[float] | None = None, step: int = 1) -> Batch:
    """A :class:`~rlvr.types.Batch` from rollouts, one group per run of consecutive rollouts of the
    same task: for calling a trainer directly in a test. ``advantages`` (one per rollout) is
    broadcast over each rollout's trainable tokens; ``None`` keeps the streams the rollouts carry."""
    if advantages is not None:
        if len(rollouts) != len(advantages):
            raise ValueError(f"batch_of: {len(rollouts)} rollouts but {len(advantages)} advantages")
        rollouts = [dataclasses.replace(r, advantages=broadcast(r, a))
                    for r, a in zip(rollouts, advantages, strict=True)]
    runs: list[list[Rollout]] = []
    for r in rollouts:
        if not runs or runs[-1][-1].task_id != r.task_id:
            runs.append([])
        runs[-1].append(r)
    groups = tuple(Group(Task(rs[0].task_id, rs[0].messages[:1], None, rs[0].task_id), tuple(rs)) for rs in runs)
    return Batch(step, groups)


@dataclass
class TrainCall:
    rollouts: list[Rollout]
    advantages: list[float]
    step: int
    batch: Batch | None = None


@dataclass
class FakeTrainer:
    """Applies no math: bumps ``version`` per step and keeps every call in ``calls``."""

    version: int = 0
    calls: list[TrainCall] = field(default_factory=list)

    def __call__(self, batch: Batch) -> dict[str, float]:
        rollouts, advantages = batch.rollouts, batch.advantages
        for i, r in enumerate(rollouts):
            check_credit(i, r)  # the contract every trainer keeps: nothing trains on misaligned streams
        self.calls.append(TrainCall(rollouts, advantages, batch.step, batch))
        self.version += 1
        return {"train/loss": -sum(a * len(r.completion_ids)
                                   for r, a in zip(rollouts, advantages, strict=True)) / len(rollouts)}

    def save(self, path: str) -> None:
        Path(path).mkdir(parents=True, exist_ok=True)
        (Path(path) / "fake_trainer.json").write_text(json.dumps({"version": self.version}))

    def load(self, path: str) -> None:
        self.version = json.loads((Path(path) / "fake_trainer.json").read_text())["version"]

    def describe(self) -> dict[str, Any]:
        return {"type": "rlvr.testing.FakeTrainer"}


class ScriptedEvaluator:
    """Held-out score per step from ``scores``: a mapping step → score or a function of step."""

    def __init__(self, scores: Mapping[int, float] | Callable[[int], float]):
        self.scores = scores
        self.calls: list[int] = []

    def __call__(self, step: int, tasks: Sequence[Task]) -> EvalReport:
        self.calls.append(step)
        if callable(self.scores):
            score = self.scores(step)
        elif step in self.scores:
            score = self.scores[step]
        else:
            raise RLLoopError(f"ScriptedEvaluator has no score for step {step}")
        return EvalReport(step=step, score=float(score), n=len(tasks))

    def describe(self) -> dict[str, Any]:
        return {"type": "rlvr.testing.ScriptedEvaluator"}


def exact_match(messages: list[dict[str, Any]], answer: Any) -> float:
    """A reward for fakes: 1.0 when the last message's content equals ``str(answer)``."""
    return 1.0 if messages[-1]["content"].strip() == str(answer).strip() else 0.0


def make_rows(n: int, *, seed: int = 0) -> list[dict[str, Any]]:
    """``n`` distinct addition rows for tests of the loop."""
    rng = rng_for(seed, "rows")
    pairs = rng.sample(range(10_000), n)
    return [{"prompt": f"{p // 100}+{p % 100}=", "answer": str(p // 100 + p % 100)} for p in pairs]


class FakeChatTokenizer:
    """Byte-level ids with a chat template like the tiny model's: ``BOS (ROLE content EOS)* ASSISTANT``.

    ``rewrite=True`` renders past assistant turns upper-cased, breaking the prefix property the
    way some real templates do (for tests of segment splitting).
    """

    BOS, EOS = 256, 257
    ROLES = {"system": 258, "user": 259, "assistant": 260, "tool": 261}

    def __init__(self, *, rewrite: bool = False):
        self.rewrite = rewrite

    def encode(self, text: str) -> list[int]:
        return list(text.encode())

    def render(self, messages: Sequence[dict[str, Any]]) -> list[int]:
        ids = [self.BOS]
        for m in messages:
            content = str(m.get("content") or "")
            if self.rewrite and m["role"] == "assistant":
                content = content.upper()
            ids += [self.ROLES[m["role"]], *self.encode(content), self.EOS]
        return ids + [self.ROLES["assistant"]]

    def decode(self, ids: Sequence[int]) -> str:
        return bytes(i for i in ids if i < 256).decode(errors="replace")


class FakeGenerator:
    """Token-in/token-out sampling from a script: ``respond(prompt_text, seed) -> completion text``.

    The completion is the text's bytes plus EOS (cut at ``params.max_tokens``, stop reason
    ``LENGTH``, as a real generator does), with seeded log-probs; the version is the ``policy``'s
    (anything with ``version``) when given. ``calls`` keeps every prompt it saw.
    """

    def __init__(self, respond: Callable[[str, int], str], *, policy: Any = None,
                 tokenizer: FakeChatTokenizer | None = None):
        self.respond, self.policy = respond, policy
        self.tokenizer = tokenizer or FakeChatTokenizer()
        self.calls: list[tuple[int, ...]] = []

    async def generate(self, prompt_ids: Sequence[int], params: Any, *, seed: int) -> Any:
        from rlvr.types import Completion

        self.calls.append(tuple(prompt_ids))
        text = self.respond(self.tokenizer.decode(prompt_ids), seed)
        ids = (*self.tokenizer.encode(text), self.tokenizer.EOS)
        stop = StopReason.STOP
        limit = getattr(params, "max_tokens", None)
        if limit is not None and len(ids) > limit:  # as a real generator: cut at the budget, say so
            ids, stop = ids[:limit], StopReason.LENGTH
        rng = rng_for(seed, "fake-generate")
        return Completion(ids, tuple(-rng.random() for _ in ids), stop, getattr(self.policy, "version", None))
