"""The held-out guarantee, made structural: no held-out row ever reaches the warm start or the
trainer, whatever the corpus, the split rules or their changes between runs; refusals come before
anything is written; a folder holding another run is never touched."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rlvr import GRPOConfig, RLLoop
from rlvr.data.tasks import carve, load_tasks
from rlvr.errors import RLLoopError, UsageError
from rlvr.testing import FakeSampler, FakeTrainer, ScriptedEvaluator, exact_match

pytest.importorskip("torch")
pytest.importorskip("peft")

from rlvr.config.run import run_config_from_dict  # noqa: E402
from rlvr.errors import ConfigError  # noqa: E402
from rlvr.record.run_folder import check_fresh_run_dir  # noqa: E402
from rlvr.wiring import base as warm  # noqa: E402
from rlvr.wiring.seams import make_loop  # noqa: E402

pytestmark = pytest.mark.train


def rows(n: int, start: int = 0) -> list[dict]:
    return [{"prompt": f"{i}+{i}=", "answer": str(2 * i)} for i in range(start, start + n)]


def write_rows(path: Path, data: list[dict]) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in data))
    return str(path)


def config(data_file: str, **loop) -> dict:
    return {
        "loop": {"max_steps": 1, "tasks_per_step": 2, "group_k": 2, "heldout_every": 1, "corpus_min": 20,
                 "heldout_frac": 0.2, "lr": 1e-4, **loop},
        "model": {"hidden": 16, "layers": 1, "heads": 2, "threads": 1},
        "task": {"name": None, "data": data_file, "env": "exact_match"},
        "sft": {"steps": 2, "batch_size": 4},
        "sampler": {"max_new_tokens": 3},
    }


@pytest.fixture
def seen_by_warm_start(monkeypatch):
    """Every prompt the SFT warm start is given, across calls."""
    seen: list[str] = []
    real = warm.sft_warm_start

    def recording(model, tokenizer, sft_rows, **kwargs):
        seen.extend(r["prompt"][-1]["content"] for r in sft_rows)
        return real(model, tokenizer, sft_rows, **kwargs)

    monkeypatch.setattr(warm, "sft_warm_start", recording)
    return seen


def test_the_contamination_repro_is_refused(tmp_path, seen_by_warm_start):
    # A run that fails its corpus floor writes nothing; the warm start never starts.
    data = write_rows(tmp_path / "rows.jsonl", rows(20))
    out = tmp_path / "run"
    with pytest.raises(RLLoopError, match="corpus_min=30"):
        make_loop(run_config_from_dict(config(data, corpus_min=30)), out, log=lambda _m: None)
    assert not out.exists() and seen_by_warm_start == []
    # A run that builds its base; then the data file grows and the same folder is used again.
    make_loop(run_config_from_dict(config(data)), out, log=lambda _m: None)
    recipe = json.loads((out / "base" / "rlvr_base.json").read_text())
    assert recipe["train_hash"] and recipe["heldout_hash"] and seen_by_warm_start
    write_rows(tmp_path / "rows.jsonl", rows(40))
    with pytest.raises(ConfigError, match=r"built for another corpus.*train_hash.*held-out"):
        make_loop(run_config_from_dict(config(data)), out, log=lambda _m: None)


def test_the_warm_start_sees_only_the_training_side(tmp_path, seen_by_warm_start):
    data = write_rows(tmp_path / "rows.jsonl", rows(30))
    cfg = run_config_from_dict(config(data))
    loop = make_loop(cfg, tmp_path / "run", log=lambda _m: None)
    heldout = {t.messages[-1]["content"] for t in loop.bench.heldout}
    assert heldout and seen_by_warm_start and not heldout & set(seen_by_warm_start)


def test_train_never_touches_a_folder_holding_something(tmp_path):
    (tmp_path / "a" / "checkpoints" / "step_000000").mkdir(parents=True)
    (tmp_path / "a" / "config.json").write_text("{}")
    (tmp_path / "a" / "checkpoints" / "step_000000" / "loop_state.json").write_text("{}")
    with pytest.raises(UsageError, match="already holds a run"):
        check_fresh_run_dir(tmp_path / "a")
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "notes.txt").write_text("mine")
    with pytest.raises(UsageError, match="not empty"):
        check_fresh_run_dir(tmp_path / "b")
    (tmp_path / "c").write_text("a file")
    with pytest.raises(UsageError, match="is a file"):
        check_fresh_run_dir(tmp_path / "c")
    assert (tmp_path / "b" / "notes.txt").read_text() == "mine" and (tmp_path / "c").read_text() == "a file"
    check_fresh_run_dir(tmp_path / "new")  # fine: nothing there
    assert not (tmp_path / "new").exists()


corpus = st.lists(st.tuples(st.integers(0, 60), st.integers(0, 3)), min_size=4, max_size=60)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(first=corpus, added=corpus, frac=st.floats(0.1, 0.5), salt=st.sampled_from(["rlvr", "a", "b"]))
def test_no_heldout_row_reaches_a_training_batch_across_corpus_changes(first, added, frac, salt):
    for data in (first, first + added):  # a corpus, then the same corpus grown (the repro's shape)
        corpus_rows = [{"prompt": f"q{a} v{b}", "answer": str(a)} for a, b in data]
        tasks = load_tasks(corpus_rows)
        try:
            split = carve(tasks, frac, salt, corpus_min=1)
        except RLLoopError as exc:  # a side would be empty: refused, never trained
            assert "the split left" in str(exc)
            continue
        held = {t.content_hash for t in split.heldout}
        assert held and not held & {t.content_hash for t in split.train}  # duplicates share a side
        config = GRPOConfig(max_steps=3, tasks_per_step=2, group_k=2, heldout_every=3, corpus_min=1,
                            heldout_frac=frac, split_salt=salt)
        trainer = FakeTrainer()
        RLLoop.from_reward(config, exact_match, split, sampler=FakeSampler(policy=trainer), trainer=trainer,
                           heldout_eval=ScriptedEvaluator(lambda s: 0.5)).run()
        trained = {g.task.content_hash for call in trainer.calls for g in call.batch.groups}
        assert trained and not trained & held
