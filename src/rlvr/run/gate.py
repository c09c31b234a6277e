"""The held-out gate: tracks held-out scores and picks the checkpoint to publish.

Selection uses held-out scores only (the pool score never enters). The best is the highest
score; ties keep the earliest step, because a later checkpoint that is merely as good has
only had more chances to overfit the pool. ``patience`` (optional) asks the loop to stop after
that many consecutive evaluations without a strict improvement. Standard library only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from rlvr.errors import RLLoopError
from rlvr.types import GateDecision


@dataclass
class HeldoutGate:
    patience: int | None = None
    scores: dict[int, float] = field(default_factory=dict)
    best_step: int | None = None
    evals_since_best: int = 0

    @property
    def best_score(self) -> float | None:
        return None if self.best_step is None else self.scores[self.best_step]

    def observe(self, step: int, score: float) -> GateDecision:
        if not isinstance(score, (int, float)) or not math.isfinite(score):
            raise RLLoopError(f"held-out evaluator returned a non-finite score {score!r} at step {step}")
        if self.scores and step <= max(self.scores):
            raise RLLoopError(f"held-out score for step {step} arrived after step {max(self.scores)}")
        self.scores[step] = float(score)
        improved = self.best_step is None or score > self.scores[self.best_step]
        if improved:
            self.best_step, self.evals_since_best = step, 0
        else:
            self.evals_since_best += 1
        stop = self.patience is not None and self.evals_since_best >= self.patience
        assert self.best_step is not None
        return GateDecision(step, float(score), self.best_step, self.scores[self.best_step],
                            improved, self.evals_since_best, stop)

    def state(self) -> dict[str, Any]:
        return {"scores": {str(k): v for k, v in self.scores.items()},
                "best_step": self.best_step, "evals_since_best": self.evals_since_best}

    def restore(self, state: dict[str, Any]) -> None:
        self.scores = {int(k): float(v) for k, v in state["scores"].items()}
        self.best_step = state["best_step"]
        self.evals_since_best = int(state["evals_since_best"])
