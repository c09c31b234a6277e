"""What a sample must satisfy before it is trained on or scored: aligned tokens, a fresh enough
policy version, a reward that is a finite number.

Pure functions. A sampler that returns the wrong number of groups or rollouts, rollouts for the
wrong task, or misaligned token fields is rejected with the task named: training on misaligned
tokens is never an option. Rewards are read by :func:`rlvr.envs.loading.evaluate_reward`; one
that raises or is not a finite number stops the run with the row and the exception named.
Standard library only.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

from rlvr.errors import RewardError, RLLoopError
from rlvr.protocols import RewardFn
from rlvr.reward import evaluate_reward_within
from rlvr.types import Rollout, Task


def check_rollout(r: Rollout, task: Task) -> None:
    if r.task_id != task.id:
        raise RLLoopError(f"sampler returned a rollout for task {r.task_id!r} in the group of {task.id!r}")
    n = len(r.completion_ids)
    if len(r.logprobs) != n or (r.loss_mask is not None and len(r.loss_mask) != n):
        raise RLLoopError(
            f"task {task.id!r}: rollout has {n} completion tokens but {len(r.logprobs)} logprobs"
            f" and {len(r.mask)} mask entries; they must align token by token"
        )
    if not r.prompt_ids:
        raise RLLoopError(f"task {task.id!r}: rollout has no prompt_ids; the trainer needs the prompt tokens")
    if any(m not in (0, 1) for m in r.mask):
        raise RLLoopError(f"task {task.id!r}: loss_mask entries must be 0 or 1")
    if not all(math.isfinite(lp) for lp in r.logprobs):
        raise RLLoopError(f"task {task.id!r}: rollout has non-finite logprobs")


def check_staleness(r: Rollout, version: int, max_offset: int, frozen: bool = False) -> None:
    """Refuse a rollout sampled from too old (or a future) policy for a step at ``version``. The
    stream stamps every policy sample with the version it was admitted under, so a version is always
    set. A ``frozen``-sourced rollout (a frozen model's sample, e.g. ``sft``'s) does not age: no policy
    sampled it, so it carries no version and the bound does not apply to it."""
    if frozen:
        if r.version is not None:
            raise RLLoopError(f"task {r.task_id!r}: a frozen model's rollout carries policy version {r.version}; "
                              "the stream clears it, so this rollout did not come through it")
        return
    if r.version is None:
        raise RLLoopError(f"task {r.task_id!r}: rollout carries no policy version; the stream stamps one on "
                          "every sample, so this rollout did not come through it")
    if not 0 <= version - r.version <= max_offset:
        raise RLLoopError(
            f"task {r.task_id!r}: rollout sampled under policy version {r.version} but the policy is at "
            f"version {version} (allowed offset {max_offset}); is the sampler serving stale weights?"
        )


def score(r: Rollout, task: Task, reward_fn: RewardFn, timeout_s: float | None = None) -> Rollout:
    """``r`` with its reward (and the reward's metrics); anything but a finite number, ``None``
    included, stops the run naming the task (the rollout stream, not this, may drop samples)."""
    try:
        result = evaluate_reward_within(reward_fn, list(r.messages), task.answer, timeout_s, task)
    except RewardError as exc:
        raise RLLoopError(f"task {task.id!r}: {exc}") from exc
    if result.value is None:
        raise RLLoopError(f"task {task.id!r}: the reward function returned None (does not apply); "
                          "a batch built here needs a reward for every rollout")
    return dataclasses.replace(r, reward=result.value, metrics={**r.metrics, **result.metrics})


def check_shape(step: int, tasks: Sequence[Task], sampled: Sequence[Sequence[Rollout]], k: int) -> None:
    """``k`` rollouts for each task, in task order."""
    if len(sampled) != len(tasks):
        left = [t.id for t in tasks[len(sampled):]]
        raise RLLoopError(f"sampler returned {len(sampled)} groups for {len(tasks)} tasks at step {step}"
                          + (f"; no group for task(s) {left}" if left else ""))
    for task, rollouts in zip(tasks, sampled, strict=True):
        if len(rollouts) != k:
            raise RLLoopError(f"sampler returned {len(rollouts)} rollouts for task {task.id!r}, expected {k}")


CREDIT_STREAMS = ("advantages", "rl_weights", "ce_weights", "ref_kl_weights", "ref_logprobs", "token_rewards")


def check_credit(i: int, r: Rollout) -> None:
    """Refuse a rollout whose credit streams cannot be trained on as they are: a stream not aligned
    with ``completion_ids``, rl tokens without advantages (or token rewards for a critic), both of
    those, ref_kl tokens without reference log-probs.
    ``i`` is its place in the batch; the error names it and its row."""
    n, where = len(r.completion_ids), f"rollout {i} of row {r.task_id!r}"
    for name in CREDIT_STREAMS:
        values = getattr(r, name)
        if values is not None and len(values) != n:
            raise RLLoopError(f"{where}: {name} has {len(values)} values for {n} completion tokens; a stream must "
                              "align with completion_ids token by token")
    if r.advantages is None and r.token_rewards is None and any(r.rl_mask):
        raise RLLoopError(f"{where}: it has rl tokens but no advantages (an algorithm that gives no rl credit sets "
                          "rl_weights to zeros)")
    if r.advantages is not None and r.token_rewards is not None:
        raise RLLoopError(f"{where}: it has both advantages and token_rewards; token rewards are for a critic to "
                          "turn into advantages, so an algorithm sets one of them")
    if any(r.ref_kl_weights or ()) and r.ref_logprobs is None:
        raise RLLoopError(f"{where}: it has ref_kl tokens but no ref_logprobs (the algorithm's score step sets them)")
