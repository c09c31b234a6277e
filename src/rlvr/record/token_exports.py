"""The trainer's token export in a run folder: what each trainer rank trained on, token by token, per step.

With ``train.token_export = true`` every trainer rank writes, for each step it trains, one JSON line per
sequence of its share of the batch, per optimizer step (a sequence trained in two PPO epochs has two):
``token_exports/step_NNNNNN/rank_R.jsonl``. A record names where it came from (``run``, ``step``,
``rank``, ``minibatch``, ``epoch``, ``row`` (its place in the rank's share of the minibatch), ``task_id``,
``sample_version``, ``reward``), holds the
ids (``prompt_ids``, ``completion_ids``) and, aligned with the completion, the per-token arrays the
loss read: ``mask``, ``advantages``, the component weights ``rl``, ``ce`` and ``ref_kl``, the
sampler's log-probs, the trainer's (``trainer_logprobs``, before that optimizer step) and the
snapshot's (``old_logprobs``, ``null`` for the on-policy first minibatch), ``entropy``, ``ratio``
(trainer over snapshot) and ``mismatch_kl`` (per token exp(d) − d − 1, d = trainer − sampler
log-prob: the k3 term of KL(sampler‖trainer), ≥ 0). So a mixed batch shows which tokens each
component trained, and a sampler-trainer mismatch shows where it is.

The ranks' files for one step are multiplexed by a marker: a rank writes ``rank_R.complete``
(``{"records": n, "world_size": W}``) after the last optimizer step of the call, so a step is
complete, for any reader, once all W markers are there, while the ranks' files may still be growing
for the next step. A rank re-training a step (a resumed run) truncates its file and removes its
marker first. :func:`read_step` returns a complete step's records (every rank's), :func:`latest_complete`
the newest complete step, :func:`summary` the mean and max of each token statistic over trained tokens.

Core: standard library only.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

EXPORT_DIR = "token_exports"
STATS = ("entropy", "mismatch_kl", "ratio")


def step_dir(root: Path, step: int) -> Path:
    return root / f"step_{step:06d}"


def records_file(root: Path, step: int, rank: int) -> Path:
    return step_dir(root, step) / f"rank_{rank}.jsonl"


def marker_file(root: Path, step: int, rank: int) -> Path:
    return step_dir(root, step) / f"rank_{rank}.complete"


def is_complete(root: Path, step: int) -> bool:
    """Whether every rank that trained ``step`` has finished writing it."""
    markers = sorted(step_dir(root, step).glob("rank_*.complete"))
    if not markers:
        return False
    world = json.loads(markers[0].read_text())["world_size"]
    return all(marker_file(root, step, r).exists() for r in range(world))


def read_step(root: Path, step: int) -> list[dict[str, Any]] | None:
    """Every rank's records of ``step``, rank by rank; ``None`` while the step is incomplete."""
    if not is_complete(root, step):
        return None
    world = json.loads(marker_file(root, step, 0).read_text())["world_size"]
    out: list[dict[str, Any]] = []
    for rank in range(world):
        with records_file(root, step, rank).open(encoding="utf-8") as lines:
            out.extend(json.loads(line) for line in lines if line.strip())
    return out


def latest_complete(root: Path) -> int | None:
    steps = sorted((int(p.name.removeprefix("step_")) for p in root.glob("step_*") if p.is_dir()), reverse=True)
    return next((s for s in steps if is_complete(root, s)), None)


def trained(record: dict[str, Any]) -> list[bool]:
    """Per completion token: whether any loss component trained it (a nonzero weight)."""
    weights = [record[k] for k in ("rl", "ce", "ref_kl") if record.get(k) is not None]
    return [any(w[i] for w in weights) for i in range(len(record["completion_ids"]))]


def summary(records: list[dict[str, Any]]) -> dict[str, float]:
    """``token_export/{stat}_mean`` and ``_max`` over the trained tokens of ``records``, and their counts."""
    out: dict[str, float] = {"token_export/records": float(len(records))}
    for stat in STATS:
        values = [v for r in records if r.get(stat) is not None
                  for v, on in zip(r[stat], trained(r), strict=True) if on and math.isfinite(v)]
        if values:
            out[f"token_export/{stat}_mean"] = sum(values) / len(values)
            out[f"token_export/{stat}_max"] = max(values)
    out["token_export/trained_tokens"] = float(sum(sum(trained(r)) for r in records))
    return out
