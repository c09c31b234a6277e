"""The scores a run keeps beside its gate, step by step, and the digest they make.

:class:`RunScores` holds the pool score of every trained step, the training rows scored like
held-out (the like-for-like side of the gap), held-out per named environment and every external
eval set's score; :meth:`RunScores.summary` is the ``summary`` of the run's finished event. The
gate (:mod:`rlvr.run.gate`) keeps held-out itself and alone decides selection: nothing here is
ever seen by it. Standard library + pydantic only.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from rlvr.config import GRPOConfig
from rlvr.record.gain import observed_in_unit_interval
from rlvr.record.run_record import Event, EventKind
from rlvr.run.gate import HeldoutGate
from rlvr.run.step_metrics import by_env
from rlvr.types import EvalReport, StopCause, Task

Evaluate = Callable[[Sequence[Task]], EvalReport]


@dataclass
class RunScores:
    """Step → score: ``pool`` (mean training reward), ``train_eval`` (training rows scored like
    held-out), ``by_env`` (held-out per environment), ``eval_sets`` (per external eval set)."""

    pool: dict[int, float] = field(default_factory=dict)
    train_eval: dict[int, float] = field(default_factory=dict)
    by_env: dict[str, dict[int, float]] = field(default_factory=dict)
    eval_sets: dict[str, dict[int, float]] = field(default_factory=dict)

    def heldout_by_env(self, step: int, tasks: Iterable[Task], report: EvalReport) -> dict[str, Any]:
        """Held-out per named environment at ``step`` (kept, and as the held-out event's ``by_env``)."""
        scores = by_env(tasks, report.per_task)
        for name, score in scores.items():
            self.by_env.setdefault(name, {})[step] = score
        return {"by_env": scores} if scores else {}

    def score_train(self, evaluate: Evaluate, tasks: Sequence[Task], step: int, heldout: float) -> dict[str, Any]:
        """Score the training sample exactly as held-out was scored (:mod:`rlvr.data.subsample`): the
        like-for-like side of the pool-vs-held-out gap."""
        if not tasks:
            return {}
        report = evaluate(tasks)
        self.train_eval[step] = report.score
        return {"train_score": report.score, "gap": report.score - heldout,
                "train_n": report.n if report.n is not None else len(tasks)}

    def score_eval_sets(self, evaluate: Evaluate, sets: Mapping[str, Sequence[Task]],
                        step: int) -> tuple[dict[str, Any], dict[str, float]]:
        """Score every external eval set: (the held-out event's ``eval``, the ``eval/<name>/*`` metrics)."""
        if not sets:
            return {}, {}
        scored = {}
        for name, tasks in sets.items():
            report = evaluate(tasks)
            scored[name] = {"score": report.score, "n": report.n if report.n is not None else len(tasks)}
            self.eval_sets.setdefault(name, {})[step] = report.score
        metrics = {f"eval/{name}/{key}": value for name, result in scored.items() for key, value in result.items()}
        return {"eval": scored}, metrics

    def read_events(self, events: Iterable[Event]) -> None:
        """The per-environment, eval-set and training-row scores a record's held-out events kept (a
        resumed run's summary covers the whole run)."""
        for e in events:
            if e.kind is EventKind.HELDOUT:
                for name, score in e.data.get("by_env", {}).items():
                    self.by_env.setdefault(name, {})[e.step] = score
                for name, result in e.data.get("eval", {}).items():
                    self.eval_sets.setdefault(name, {})[e.step] = result["score"]
                if "train_score" in e.data:
                    self.train_eval[e.step] = e.data["train_score"]

    def summary(self, config: GRPOConfig, gate: HeldoutGate, metrics: list[dict[str, Any]], steps_run: int,
                stop_cause: StopCause | None) -> dict[str, Any]:
        """A JSON-serialisable digest of the run."""
        held, base, best = dict(gate.scores), gate.scores.get(0), gate.best_score
        # Like for like: training rows scored as held-out is (greedy, same budget); without them, the pool.
        train = self.train_eval if config.train_eval else self.pool
        gap = {s: train[s] - h for s, h in held.items() if s in train}
        return {
            "selected_step": gate.best_step, "selected_heldout_score": best, "baseline_heldout_score": base,
            "heldout_gain": None if base is None or best is None else best - base,
            # Gains read as points only when every reward seen lies in [0, 1] (rlvr.record.gain).
            "rewards_in_unit_interval": observed_in_unit_interval(metrics, held, self.pool, self.train_eval),
            "final_heldout_score": held[max(held)] if held else None,
            "final_pool_score": self.pool[max(self.pool)] if self.pool else None,
            "pool_heldout_gap": gap, "max_pool_heldout_gap": max(gap.values(), default=None),
            "gap_basis": ("training rows scored like held-out" if config.train_eval
                          else "pool score: mean reward of training samples"),
            "train_eval_scores": dict(self.train_eval), "heldout_scores": held, "pool_scores": dict(self.pool),
            **({"heldout_by_env": {k: dict(v) for k, v in self.by_env.items()}} if self.by_env else {}),
            **({"eval_scores": {k: dict(v) for k, v in self.eval_sets.items()}} if self.eval_sets else {}),
            "steps_run": steps_run, "stop_cause": stop_cause and str(stop_cause),
            "config_sha256": config.digest(),
        }
