"""Warnings a run gives about itself, from its own numbers: when it is cut short or cannot learn.

A run can go through every step and learn nothing without an error anywhere: the completion budget
cuts most completions (the reward reads cut-off text), or every group's rewards are equal (a
group-relative advantage is then 0 for every sample), or the reward is one value for every sample
(the task is out of reach, or the reward never pays). :class:`RunAdvice` watches each trained batch
and says so, naming the cause and what to change, as a warning event in the record and a log line.

- ``truncated``: more than half of a step's completions stopped at the completion budget
  (``StopReason.LENGTH``); said the first time it happens.
- ``constant_reward``: every sample of ``window`` consecutive steps got the same reward.
- ``zero_variance``: every group of ``window`` consecutive steps had equal rewards within it.
Each is said once per run session (the constant reward, being the sharper diagnosis, is said instead
of zero variance when both hold). Standard library only.
"""

from __future__ import annotations

import sys
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

from rlvr.types import Group, StopReason

__all__ = ["RunAdvice"]


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


class RunAdvice:
    """Reads each trained batch (:meth:`observe`); warnings come out of :meth:`take_warnings` (each once,
    for the record) and are logged as they are found."""

    def __init__(self, window: int, log: Callable[[str], None] | None = None):
        self.window, self.log = window, log or _stderr
        self._recent: deque[tuple[bool, frozenset[float]]] = deque(maxlen=window)  # (all groups flat, rewards)
        self._said: set[str] = set()
        self._warnings: list[dict[str, Any]] = []

    def observe(self, step: int, groups: Sequence[Group]) -> None:
        rollouts = [r for g in groups for r in g.rollouts]
        if not rollouts:
            return
        cut = sum(r.stop_reason == StopReason.LENGTH for r in rollouts) / len(rollouts)
        if cut > 0.5:
            self._say("truncated", step, f"step {step}: {cut:.0%} of the completions stopped at the completion "
                      "budget (sampler.max_new_tokens); the reward scores cut-off text and truncated samples train "
                      "the model to stop mid-answer: raise sampler.max_new_tokens", truncated_frac=cut)
        flat = all(len({r.reward for r in g.rollouts}) <= 1 for g in groups)
        self._recent.append((flat, frozenset(float(r.reward) for r in rollouts if r.reward is not None)))
        if len(self._recent) < self.window or not all(f for f, _ in self._recent):
            return
        values = frozenset().union(*(v for _, v in self._recent))
        first = step - self.window + 1
        if len(values) == 1:
            value = next(iter(values))
            self._say("constant_reward", step, f"steps {first}-{step}: every sample got reward {value:g}, so every "
                      "advantage is 0 and nothing is learned. "
                      + ("The reward never pays: read a few completions (samples/) against what the reward expects "
                         "(its answer format, the gold answer column), check the completion budget, or start from a "
                         "stronger base (an [sft] warm start) so some samples succeed" if value <= 0 else
                         "Every sample already earns it: the task is too easy to teach anything"),
                      reward=value, steps=self.window)
        elif "constant_reward" not in self._said:
            self._say("zero_variance", step, f"steps {first}-{step}: within every group all samples got the same "
                      "reward, so group-relative advantages are 0 and nothing is learned: each task is all solved or "
                      "all failed; raise loop.group_k or loop.temp for more varied samples, or use tasks nearer "
                      "the model's level", steps=self.window)

    def _say(self, kind: str, step: int, message: str, **figures: Any) -> None:
        if kind in self._said:
            return
        self._said.add(kind)
        self._warnings.append({"warning": kind, "message": message, **figures})
        self.log(f"rlvr: warning: {message}")

    def take_warnings(self) -> list[dict[str, Any]]:
        """Warnings not yet handed out (each once), for the run record."""
        out, self._warnings = self._warnings, []
        return out
