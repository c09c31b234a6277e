"""Shared builders for the test suite: small configs, fake rigs and record readers.

Everything here is standard library + rlvr's own fakes (``rlvr.testing``); no torch.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from rlvr import GRPOConfig, RLLoop
from rlvr.record.run_record import RunRecord, strip_timing
from rlvr.testing import FakeSampler, FakeTrainer, ScriptedEvaluator, exact_match, make_rows

# As the rlvr command does (rlvr/wiring/cpu_waits.py), before any test loads torch: the suite's own
# processes train too, and on a machine shared with other work spinning threads crawl.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

N_ROWS = 40


def small_config(**overrides: Any) -> GRPOConfig:
    """A config sized for fast tests: 40 rows, 2 completions per task, 3 tasks per step; held-out is
    scored alone (``train_eval`` off: its training-row scoring is tested on its own)."""
    base: dict[str, Any] = dict(group_k=2, tasks_per_step=3, heldout_every=3, max_steps=8,
                                corpus_min=20, heldout_frac=0.25, seed=0, train_eval=False)
    return GRPOConfig(**{**base, **overrides})


def rising(version: int) -> float:
    """A skill that keeps rising with the policy version (pool score goes up step after step)."""
    return min(0.95, 0.1 + 0.1 * version)


@dataclass
class Rig:
    """A loop with its fakes, so tests can look at what each seam saw."""

    loop: RLLoop
    trainer: FakeTrainer
    sampler: FakeSampler
    evaluator: ScriptedEvaluator
    rows: list[dict[str, Any]] = field(default_factory=list)

    def trained_task_ids(self) -> list[str]:
        """Every task id the trainer was given, in order, one per group (not per rollout)."""
        return [r.task_id for call in self.trainer.calls for r in call.rollouts[:: self.loop.config.group_k]]


def make_rig(config: GRPOConfig | None = None, *, rows: list[dict[str, Any]] | None = None,
             skill: float | Callable[[int], float] = rising,
             scores: Mapping[int, float] | Callable[[int], float] = lambda s: 0.1 + 0.01 * s,
             sampler_cls: type[FakeSampler] = FakeSampler, trainer: Any = None, sampler: Any = None,
             reward: Any = exact_match, **loop_kwargs: Any) -> Rig:
    """A loop over fakes; ``trainer``, ``sampler`` and ``reward`` replace the rig's own (a test's
    sampler is built over the trainer it is given, so build the trainer first)."""
    config = config or small_config()
    rows = make_rows(N_ROWS) if rows is None else rows
    trainer = FakeTrainer() if trainer is None else trainer
    sampler = sampler_cls(skill, policy=trainer) if sampler is None else sampler
    evaluator = ScriptedEvaluator(scores)
    loop = RLLoop.from_reward(config, reward, rows, sampler=sampler, trainer=trainer,
                              heldout_eval=evaluator, **loop_kwargs)
    return Rig(loop, trainer, sampler, evaluator, rows)


def step_task_ids(record: RunRecord) -> list[list[str]]:
    return [e.data["task_ids"] for e in record.events if str(e.kind) == "step"]


def record_files(out_dir: Path) -> dict[str, list[str]]:
    """Each record file of a run folder as canonical JSON lines with timing stripped.

    Covers run.json, events.jsonl, metrics.jsonl, selected.json and every checkpoint's
    loop_state.json; keys are paths relative to ``out_dir``.
    """
    out_dir = Path(out_dir)
    files: dict[str, list[str]] = {}

    def canon(obj: Any) -> str:
        return json.dumps(strip_timing(obj), sort_keys=True, ensure_ascii=False)

    for name in ("run.json", "selected.json"):
        files[name] = [canon(json.loads((out_dir / name).read_text()))]
    for name in ("events.jsonl", "metrics.jsonl"):
        lines = (out_dir / name).read_text().splitlines()
        files[name] = [canon(json.loads(line)) for line in lines]
    for state in sorted(out_dir.glob("checkpoints/*/loop_state.json")):
        files[str(state.relative_to(out_dir))] = [canon(json.loads(state.read_text()))]
    return files


def forbidden(name: str) -> Callable[..., Any]:
    """A seam that fails the test if the loop ever calls it."""

    def seam(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError(f"the {name} seam was called")

    return seam


@pytest.fixture
def rows() -> list[dict[str, Any]]:
    return make_rows(N_ROWS)


class AbortAfter:
    """``should_abort`` that turns true at its ``n``-th poll after the first, i.e. after ``n`` steps."""

    def __init__(self, n: int):
        self.n, self.polls = n, 0

    def __call__(self) -> bool:
        self.polls += 1
        return self.polls > self.n


@pytest.fixture
def stand_in_conversion(monkeypatch) -> list[tuple[Path, Path]]:
    """GGUF conversion replaced by one that writes only the finished-folder marker; records each
    ``(file, folder)`` it was asked for. The real conversion runs in tests/e2e/test_smollm2.py."""
    from rlvr.backends.model import sources

    calls: list[tuple[Path, Path]] = []

    def convert(gguf: Path, folder: Path, digest: str) -> Path:
        calls.append((gguf, folder))
        folder.mkdir(parents=True, exist_ok=True)
        (folder / sources.SOURCE_MARKER).write_text(json.dumps({"format": sources.FORMAT_VERSION, "sha256": digest}))
        return folder

    monkeypatch.setattr(sources, "convert_gguf", convert)
    return calls


@pytest.fixture(autouse=True, scope="session")
def fingerprint_cache(tmp_path_factory):
    """Base folders' hashes (:mod:`rlvr.backends.model.fingerprint`; every tiny-model run hashes its
    ``base/``) kept in the session's temporary folder, not the user's cache. ``RLVR_CACHE``, where a
    test sets it, still wins; GGUF conversions keep the user's cache (converted once, across sessions)."""
    from rlvr.backends.model import fingerprint

    cache = tmp_path_factory.mktemp("rlvr_cache")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(fingerprint, "default_cache_dir", lambda: Path(os.environ.get("RLVR_CACHE") or cache))
        yield cache
