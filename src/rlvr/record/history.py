"""Earlier runs, read back from their records: what each reached, and how two configs differ.

:func:`run_summary` reads one run folder (``run.json``, ``events.jsonl``, ``selected.json``) into a
:class:`RunSummary`: its status, base, steps, best and selected held-out scores, peak memory and
wall time. :func:`find_runs` finds every run folder under a root (the root itself, its children and
their children). :func:`config_differences` compares two resolved configs key by key, leaving out
:data:`RUN_ONLY` keys (where a run writes, how it logs and is watched, how its processes are
placed: nothing that changes what it computes). :func:`sampler_placement` names where a config's
sampler runs (its backend, and in the training process, in a server rlvr starts, or elsewhere):
what decides whose memory a run's measured peak holds. :func:`earlier_tries` answers "has this been
tried": the runs with the same base, data and split as a run about to start, and for each the
config keys that differ (none: the same run).

Reading never fails on a half-written or foreign folder: it is skipped (``find_runs``) or read as far
as it goes. Standard library only.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlvr.errors import RecordError
from rlvr.record.run_record import EventKind, read_record

# Keys that say where and how a run is carried out, not what it computes: never a difference.
RUN_ONLY = ("log.", "watchdog.", "cluster.", "model.threads", "sampler.server_threads", "sampler.timeout_s",
            "sampler.retries", "sampler.startup_timeout_s", "sampler.max_concurrency", "sampler.vllm_python",
            "sampler.serve_command", "sampler.stop_command", "train.token_export")


@dataclass(frozen=True)
class RunSummary:
    """One run as its record tells it."""

    path: Path
    status: str  # finished (stop cause), failed, aborted, or started (no end recorded yet)
    base: str  # the base model: a hub name, file or folder, or "tiny(...)" for the built-in one
    steps: int  # optimizer steps recorded
    best_heldout: float | None  # the best held-out score recorded
    selected_step: int | None  # the published checkpoint
    selected_heldout: float | None  # its held-out score
    baseline_heldout: float | None  # held-out at step 0
    config: dict[str, Any] = field(default_factory=dict)  # the resolved config, sections as recorded
    split: dict[str, Any] = field(default_factory=dict)  # counts and hashes (rlvr.data.tasks.split_manifest)
    base_sha256: str | None = None  # a GGUF base file's hash, when the base is one
    created_at: float | None = None
    ended_at: float | None = None
    peak_mb: float | None = None  # the training process's peak resident memory (mem/process_peak_mb)

    @property
    def wall_s(self) -> float | None:
        if self.created_at is None or self.ended_at is None:
            return None
        return self.ended_at - self.created_at

    def same_data(self, split: Mapping[str, Any]) -> bool:
        keys = ("train_hash", "heldout_hash")
        return all(self.split.get(k) is not None and self.split.get(k) == split.get(k) for k in keys)

    def reached(self) -> str:
        """What the run reached, in words: its status, steps, selection and held-out gain."""
        said = f"{self.status} at step {self.steps}"
        if self.selected_step is not None and self.selected_heldout is not None:
            said += f": selected step {self.selected_step}, held-out {self.selected_heldout:.3f}"
            if self.baseline_heldout is not None:
                said += f" (from {self.baseline_heldout:.3f} at step 0)"
        return said


def base_of(config: Mapping[str, Any]) -> str:
    """The base a recorded config names: ``model.base``, or the built-in tiny model with its shape."""
    model = config.get("model") or {}
    base = model.get("base") or (config.get("loop") or {}).get("base")
    if base:
        return str(base)
    shape = ",".join(f"{k}={model[k]}" for k in ("hidden", "layers", "heads", "init_seed") if k in model)
    return f"tiny({shape})" if shape else "?"


def sampler_placement(config: Mapping[str, Any]) -> str | None:
    """Where a recorded config's sampler runs, as ``"<backend>/<place>"``: ``in-process`` (a worker
    thread of the training process), ``colocated`` (vLLM's engine inside the training process),
    ``server`` (a server rlvr starts beside the trainer) or ``remote`` (one at ``sampler.url``, not
    rlvr's to count); ``None`` when the config does not say (a record without a sampler section)."""
    sampler = config.get("sampler")
    if not isinstance(sampler, Mapping) or not isinstance(sampler.get("backend"), str):
        return None
    backend = sampler["backend"]
    if backend == "in_process":
        place = "in-process"
    elif backend == "vllm_colocate":
        place = "colocated"
    else:
        place = "remote" if sampler.get("url") else "server"
    return f"{backend}/{place}"


def run_summary(path: str | Path) -> RunSummary:
    """One run folder read back; :class:`~rlvr.errors.RecordError` if it is not one."""
    record = read_record(path)
    run = record.run
    config = run.get("run_config") or {"loop": run.get("config", {})}
    ends = [e for e in record.events if e.kind in (EventKind.FINISHED, EventKind.FAILED, EventKind.ABORTED)]
    last = ends[-1] if ends else None
    resumed_after = last is not None and any(e.kind is EventKind.RESUMED and e.time is not None
                                             and last.time is not None and e.time > last.time
                                             for e in record.events)
    if last is None or resumed_after:
        status = "started"
    elif last.kind is EventKind.FINISHED:
        status = f"finished ({last.data.get('stop_cause')})"
    else:
        status = str(last.kind)
    held = record.heldout_scores
    steps = [e.step for e in record.events if e.kind is EventKind.STEP]
    selected = record.selected or {}
    peak = last.data.get("mem/process_peak_mb") if last is not None and last.kind is EventKind.FINISHED else None
    times = [e.time for e in record.events if e.time is not None]
    return RunSummary(
        path=Path(path), status=status, base=base_of(config), steps=max(steps, default=0),
        best_heldout=max(held.values()) if held else None, selected_step=selected.get("step"),
        selected_heldout=selected.get("heldout_score"), baseline_heldout=held.get(0),
        config=config, split=dict(run.get("split") or {}), base_sha256=(run.get("base_source") or {}).get("sha256"),
        created_at=run.get("created_at"), ended_at=max(times) if times else None,
        peak_mb=peak if isinstance(peak, (int, float)) else None)


def find_runs(root: str | Path) -> list[RunSummary]:
    """Every readable run under ``root`` (itself, its children, their children), oldest first."""
    root = Path(root)
    if not root.is_dir():
        return []
    candidates = [root, *_subfolders(root)]
    candidates += [q for p in candidates[1:] if not (p / "run.json").exists() for q in _subfolders(p)]
    found = []
    for folder in candidates:
        if (folder / "run.json").is_file():
            try:
                found.append(run_summary(folder))
            except (RecordError, OSError, ValueError, KeyError, TypeError):
                continue  # half-written or not rlvr's: not a run to compare with
    return sorted(found, key=lambda r: (r.created_at or 0.0, str(r.path)))


def _subfolders(folder: Path) -> list[Path]:
    """``folder``'s subfolders, sorted; none when it vanished meanwhile (another run's folder, removed
    while this one looked: runs beside each other come and go)."""
    try:
        return sorted(p for p in folder.iterdir() if p.is_dir())
    except OSError:
        return []


def flatten(config: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"loop": {"lr": 1e-4}}`` as ``{"loop.lr": 1e-4}``; lists and leaves kept as they are."""
    flat: dict[str, Any] = {}
    for key, value in config.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            flat.update(flatten(value, dotted + "."))
        else:
            flat[dotted] = value
    return flat


def run_only(key: str) -> bool:
    return any(key == k or (k.endswith(".") and key.startswith(k)) for k in RUN_ONLY)


def config_differences(mine: Mapping[str, Any], theirs: Mapping[str, Any]) -> list[tuple[str, Any, Any]]:
    """``(key, mine, theirs)`` for every key whose value differs (a key one side lacks counts as
    ``None`` there), :data:`RUN_ONLY` keys left out, sorted by key."""
    a, b = flatten(mine), flatten(theirs)
    return [(k, a.get(k), b.get(k)) for k in sorted(a.keys() | b.keys())
            if not run_only(k) and _canonical(a.get(k)) != _canonical(b.get(k))]


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, default=str)


@dataclass(frozen=True)
class Try:
    """An earlier run with the same base, data and split, and the config keys in which it differs."""

    run: RunSummary
    differences: list[tuple[str, Any, Any]]

    @property
    def identical(self) -> bool:
        return not self.differences


def earlier_tries(runs: Iterable[RunSummary], config: Mapping[str, Any], split: Mapping[str, Any],
                  base_sha256: str | None = None, exclude: Path | None = None) -> list[Try]:
    """The runs of ``runs`` with this base (and base file hash, when both know one), data and split;
    identical configs first, then by fewest differences."""
    base = base_of(config)
    tries = []
    for run in runs:
        if exclude is not None and run.path.resolve() == exclude.resolve():
            continue
        if run.base != base or not run.same_data(split):
            continue
        if base_sha256 and run.base_sha256 and base_sha256 != run.base_sha256:
            continue
        tries.append(Try(run, config_differences(config, run.config)))
    return sorted(tries, key=lambda t: (len(t.differences), t.run.created_at or 0.0))


def difference_text(differences: list[tuple[str, Any, Any]], limit: int = 4) -> str:
    """``loop.lr 0.0001 (there 0.0003), ...``: what this config says, and what the other one said."""
    parts = [f"{k} {_short(mine)} (there {_short(theirs)})" for k, mine, theirs in differences[:limit]]
    more = len(differences) - limit
    return ", ".join(parts) + (f" and {more} more" if more > 0 else "")


def _short(value: Any) -> str:
    text = json.dumps(value, default=str) if not isinstance(value, str) else value
    return text if len(text) <= 40 else text[:37] + "..."
