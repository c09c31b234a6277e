"""The rows each held-out evaluation scores: a capped, stable sample of the held-out split, and an
equally sized sample of the training split scored the same way.

A held-out split of 20k rows evaluated greedily every ``heldout_every`` steps costs more than the
training; ``loop.heldout_max_rows`` caps what is scored to a sample chosen by salted content hash, so
it survives reordering and resume like the split itself. The rest of the split is still held out:
the split is carved first and the sample is taken from its held-out side only.

The pool score (the mean reward of temperature-sampled training completions) cannot be compared with
a greedy held-out score: one is sampled, the other is not. So each evaluation also scores a sample of
the training split exactly as held-out is scored (same evaluator, same greedy decoding, same budget,
as many rows), and the pool-vs-held-out gap is measured on those two (``loop.train_eval``).

Invariants: a sample is a pure function of the rows' content and the split's salt; it never mixes
sides; both samples keep the split's order. Standard library only.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from rlvr.seeding import stable_hash
from rlvr.types import Split, Task

__all__ = ["EvalRows", "evaluation_rows", "stable_subsample"]


def stable_subsample(tasks: Sequence[Task], n: int | None, salt: str) -> tuple[Task, ...]:
    """The ``n`` tasks with the smallest salted content hash (ties by id), in the order given; all of
    them when ``n`` is ``None`` or at least ``len(tasks)``."""
    if n is None or n >= len(tasks):
        return tuple(tasks)
    chosen = {t.id for t in sorted(tasks, key=lambda t: (stable_hash(t.content_hash, salt), t.id))[:n]}
    return tuple(t for t in tasks if t.id in chosen)


@dataclass(frozen=True, slots=True)
class EvalRows:
    """What every held-out evaluation scores: ``heldout`` (the gate's rows) and ``train`` (training
    rows scored the same way, for the like-for-like gap; empty when off), and what run.json says."""

    heldout: tuple[Task, ...]
    train: tuple[Task, ...]
    manifest: dict[str, Any]


def evaluation_rows(split: Split, heldout_max_rows: int | None, train_eval: bool) -> EvalRows:
    """The held-out rows to score (at most ``heldout_max_rows``) and, with ``train_eval``, as many
    training rows (at most the training split)."""
    heldout = stable_subsample(split.heldout, heldout_max_rows, f"{split.salt}/heldout-eval")
    train = stable_subsample(split.train, len(heldout), f"{split.salt}/train-eval") if train_eval else ()
    return EvalRows(heldout, train, {
        "n_heldout_evaluated": len(heldout), "heldout_max_rows": heldout_max_rows,
        "heldout_evaluated_hash": _digest(heldout), "n_train_evaluated": len(train),
        **({"train_evaluated_hash": _digest(train)} if train else {})})


def _digest(tasks: Sequence[Task]) -> str:
    return stable_hash("\n".join(sorted(t.content_hash for t in tasks)))
