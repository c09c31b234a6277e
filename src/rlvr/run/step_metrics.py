"""A train step's figures, as ``metrics.jsonl`` records them: what the batch held (``rollout/*``,
``async/*``, ``reward/*``, ``env/*``) and where the step's time went (``perf/*``, ``time/*``).

Pure functions of what the loop hands them (the batch, the version it trained, the step's clock
readings): nothing here reads the loop, so a figure means the same in every run and the order of
keys in a record row is the order written here. Standard library only.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, cast

from rlvr.data.tasks import mean
from rlvr.types import StopReason, StreamBatch, Task, Trajectory


def batch_metrics(batch: StreamBatch, version: int, frozen: set[int], epochs_seen: float) -> dict[str, float]:
    """What the batch trained at ``version`` held: rewards, lengths, drops, and how far behind the
    policy its samples were (``async/*``; groups whose ``id`` is in ``frozen`` came from a frozen
    model and have no policy version to lag). ``epochs_seen``: the training split seen so far."""
    rollouts = batch.rollouts
    rewards = cast("list[float]", [r.reward for r in rollouts])  # every sample the stream hands out is scored
    offsets = [version - r.version for g in batch.groups if id(g) not in frozen  # type: ignore[operator]
               for r in g.rollouts] or [0]
    return {
        "rollout/reward": mean(rewards), "rollout/reward_std": std(rewards),
        "rollout/reward_min": min(rewards), "rollout/reward_max": max(rewards),
        "rollout/zero_std_frac": sum(len(set(g.rewards)) == 1 for g in batch.groups) / len(batch.groups),
        "rollout/completion_len": mean([len(r.completion_ids) for r in rollouts]),
        **trajectory_metrics(batch.trajectories),
        "rollout/truncated_frac": mean([r.stop_reason == StopReason.LENGTH for r in rollouts]),
        "rollout/filter_drop_ratio": batch.filter_drop_ratio,
        "rollout/sample_drops": len(batch.sample_drops), "rollout/groups": len(batch.groups),
        "data/epochs_seen": epochs_seen,
        "async/version_offset_max": max(offsets), "async/version_offset_mean": mean(offsets),
        **reward_metrics(rollouts), **env_metrics(batch.groups),
    }


@dataclass(frozen=True)
class StepClock:
    """One step's clock readings (``time.monotonic``): asked for the batch, got it, trained,
    published; the stream's busy seconds as training began and ended; and the wall time since the
    previous step ended."""

    asked: float
    sampled: float
    trained: float
    published: float
    busy_before: float
    busy_after: float
    step_time: float

    def metrics(self, scoring_s: float) -> dict[str, float]:
        """``perf/*`` and ``time/scoring``: waiting for samples, training, weight sync, and how much
        sampling overlapped training (the stream's busy time while the trainer ran)."""
        wait, train = self.sampled - self.asked, self.trained - self.sampled
        return {"perf/sample_wait_time": wait, "perf/train_time": train,
                "perf/weight_sync_time": self.published - self.trained,
                "perf/step_time": self.step_time, "time/scoring": scoring_s,
                "perf/wait_time_ratio": wait / self.step_time if self.step_time > 0 else 0.0,
                "perf/overlap_ratio": (self.busy_after - self.busy_before) / train if train > 0 else 0.0}


def reward_metrics(rollouts: list[Any]) -> dict[str, float]:
    """The mean of each metric environments attached to samples (a Score's components, ``parsed``,
    ``tool_calls``...), over the samples that carry it, as ``reward/<name>``."""
    values: dict[str, list[float]] = {}
    for r in rollouts:
        for key, value in r.metrics.items():
            values.setdefault(key, []).append(value)
    return {f"reward/{key}": mean(v) for key, v in sorted(values.items())}


def trajectory_metrics(shapes: Sequence[Trajectory]) -> dict[str, float]:
    """Means over the batch's samples: ``rollout/n_turns`` (model turns) and
    ``rollout/trajectory_length`` (tokens of the whole conversation), see :class:`~rlvr.types.Trajectory`."""
    if not shapes:
        return {}
    return {"rollout/n_turns": mean([t.turns for t in shapes]),
            "rollout/trajectory_length": mean([t.tokens for t in shapes])}


def env_metrics(groups: Iterable[Any]) -> dict[str, float]:
    """``env/<name>/reward`` and ``env/<name>/groups`` per named environment (rows that name none
    have no figures of their own: their run's figures are the batch's)."""
    rewards: dict[str, list[float]] = {}
    counts: dict[str, int] = {}
    for g in groups:
        if g.task.env is not None:
            rewards.setdefault(g.task.env, []).extend(g.rewards)
            counts[g.task.env] = counts.get(g.task.env, 0) + 1
    return {**{f"env/{k}/reward": mean(v) for k, v in sorted(rewards.items())},
            **{f"env/{k}/groups": float(n) for k, n in sorted(counts.items())}}


def by_env(tasks: Iterable[Task], per_task: dict[str, float] | None) -> dict[str, float]:
    """Held-out score per named environment (mean over its tasks)."""
    if not per_task:
        return {}
    scores: dict[str, list[float]] = {}
    for t in tasks:
        if t.env is not None and t.id in per_task:
            scores.setdefault(t.env, []).append(per_task[t.id])
    return {k: mean(v) for k, v in sorted(scores.items())}


def std(xs: list[Any]) -> float:
    m = mean(xs)
    return (sum((x - m) ** 2 for x in xs) / len(xs)) ** 0.5 if xs else float("nan")
