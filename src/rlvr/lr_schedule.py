"""The learning-rate schedule: the factor of the peak learning rate at each train step.

A schedule is a pure function of the train step (1-based: step ``t`` trains version ``t − 1``),
so a run resumed at any step continues the exact curve an uninterrupted run follows, with nothing
to save but the schedule's own parameters (the trainer keeps them in its checkpoint, so a resume
that raises ``loop.max_steps`` does not bend the curve it started on). Every optimizer step of a
train step (PPO minibatches, update epochs) uses that step's rate.

With W warmup steps, T total steps and m = ``min_lr_ratio``:

- warmup (any kind, W > 0): factor t / W for t ≤ W, so step W is the first at the peak and step 1 is
  not spent at rate 0 (Hugging Face's schedulers start at 0);
- ``constant``: 1 after warmup;
- ``linear``: m + (1 − m)(1 − p), ``cosine``: m + (1 − m)·½(1 + cos πp), with p = (t − 1 − W)/(T − W)
  the progress after warmup: the first step after warmup is at the peak, and the curve approaches
  m at step T without a step spent at rate m·0 when m = 0;
- ``wsd`` (warmup-stable-decay): 1 until the last D steps, then linear to m over them, with
  p = (t − 1 − (T − D))/D.

After step T the factor stays where the curve ends (m for the decaying kinds).
Standard library only.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

LR_SCHEDULES = ("constant", "linear", "cosine", "wsd")


@dataclass(frozen=True, slots=True)
class LRSchedule:
    """The factor of the peak learning rate per train step (see the module docstring)."""

    kind: str = "constant"
    total_steps: int = 1
    warmup_steps: int = 0
    min_lr_ratio: float = 0.0
    decay_steps: int = 0  # wsd: the last steps, decaying to min_lr_ratio

    def __post_init__(self) -> None:
        if self.kind not in LR_SCHEDULES:
            raise ValueError(f"lr_schedule {self.kind!r} is not one of {list(LR_SCHEDULES)}")
        if self.total_steps < 1 or self.warmup_steps < 0 or self.decay_steps < 0:
            raise ValueError(f"lr schedule steps must be total >= 1, warmup >= 0, decay >= 0; got {self}")
        if not 0.0 <= self.min_lr_ratio <= 1.0:
            raise ValueError(f"min_lr_ratio={self.min_lr_ratio} must be in [0, 1]")
        if self.kind != "constant" and self.warmup_steps + max(self.decay_steps, 1) > self.total_steps:
            raise ValueError(f"{self.warmup_steps} warmup steps leave no room to decay in {self.total_steps} steps "
                             f"(lr_schedule = {self.kind!r}); shorten the warmup or run more steps")

    def factor(self, step: int) -> float:
        """The learning rate of train ``step`` (1-based) over the peak."""
        w, t = self.warmup_steps, step
        if w and t <= w:
            return max(t, 0) / w
        if self.kind == "constant":
            return 1.0
        if self.kind == "wsd":
            stable = self.total_steps - self.decay_steps
            if t <= stable:
                return 1.0
            return self._decayed((t - 1 - stable) / self.decay_steps, linear=True)
        return self._decayed((t - 1 - w) / (self.total_steps - w), linear=self.kind == "linear")

    def _decayed(self, progress: float, *, linear: bool) -> float:
        p = min(max(progress, 0.0), 1.0)
        shape = 1.0 - p if linear else 0.5 * (1.0 + math.cos(math.pi * p))
        return self.min_lr_ratio + (1.0 - self.min_lr_ratio) * shape

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def plan_schedule(kind: str, total_steps: int, *, warmup_steps: int | None = None, warmup_ratio: float | None = None,
                  min_lr_ratio: float = 0.0, decay_ratio: float | None = None) -> LRSchedule:
    """The schedule of a run of ``total_steps`` train steps. ``warmup_ratio`` is a fraction of them
    (rounded up, as Hugging Face does); ``decay_ratio`` (wsd) the fraction spent decaying (default 0.1,
    rounded up, at least one step). Raises ValueError on a combination that cannot be honoured."""
    if warmup_steps is not None and warmup_ratio is not None:
        raise ValueError("set warmup_steps or warmup_ratio, not both")
    if decay_ratio is not None and kind != "wsd":
        raise ValueError(f"decay_ratio is for lr_schedule = 'wsd', not {kind!r}")
    warmup = warmup_steps if warmup_steps is not None else math.ceil((warmup_ratio or 0.0) * total_steps)
    decay = max(1, math.ceil((0.1 if decay_ratio is None else decay_ratio) * total_steps)) if kind == "wsd" else 0
    return LRSchedule(kind, total_steps, warmup, min_lr_ratio, decay)


def schedule_horizon(max_steps: int, epochs: int | None, n_train: int, tasks_per_step: int) -> int:
    """The train steps a schedule spans: ``max_steps``, or fewer when ``epochs`` passes over the
    ``n_train`` training rows at ``tasks_per_step`` rows a step end sooner (filtered rows count as
    seen, so a run that filters rows may stop before the curve ends)."""
    if epochs is None:
        return max_steps
    return max(1, min(max_steps, math.ceil(epochs * n_train / tasks_per_step)))
