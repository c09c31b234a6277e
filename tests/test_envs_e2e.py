"""Every built-in environment through the CPU demo's pipeline: a tiny model, a few real steps,
a run record on disk. Marked slow (a few seconds each)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("peft")

from rlvr.backends.pipeline import make_loop  # noqa: E402
from rlvr.envs import arithmetic  # noqa: E402
from rlvr.record import read_record  # noqa: E402
from rlvr.settings import run_config_from_dict  # noqa: E402

pytestmark = [pytest.mark.train, pytest.mark.slow]


def config(task: dict, **loop) -> dict:
    return {
        "loop": {"max_steps": 2, "tasks_per_step": 4, "group_k": 2, "heldout_every": 2, "corpus_min": 20,
                 "heldout_frac": 0.2, "lora_rank": 0, "lr": 1e-4, "temp": 1.0, **loop},
        "model": {"hidden": 32, "layers": 1, "heads": 2, "threads": 1},
        "task": {"n": 60, **task},
        "sampler": {"max_new_tokens": 6},
    }


def rows_file(tmp_path: Path, answer=lambda r: r["answer"]) -> str:
    path = tmp_path / "rows.jsonl"
    rows = arithmetic.make_rows(60, seed=0)
    path.write_text("".join(json.dumps({**r, "answer": answer(r)}) + "\n" for r in rows))
    return str(path)


def train(tmp_path: Path, data: dict) -> dict:
    cfg = run_config_from_dict(data)
    loop = make_loop(cfg, tmp_path / "run", log=lambda _m: None)
    loop.run()
    record = read_record(tmp_path / "run")
    assert record.finished is not None and record.finished.data["stop_cause"] == "max_steps"
    assert [e.step for e in record.of_kind("step")] == [1, 2]
    assert (tmp_path / "run" / "selected.json").exists()
    return {"record": record, "loop": loop}


@pytest.mark.parametrize("name", ["addition", "arithmetic", "countdown", "reverse_text", "sorting"])
def test_procedural_tasks_run_the_demo_loop(tmp_path, name):
    train(tmp_path, config({"name": name, "params": {}}))


def test_exact_match_over_a_rows_file(tmp_path):
    out = train(tmp_path, config({"name": None, "data": rows_file(tmp_path), "env": "exact_match"}))
    assert out["record"].run["seams"]["rollout_fn"]


def test_math_verify_over_a_rows_file(tmp_path):
    pytest.importorskip("math_verify")
    train(tmp_path, config({"name": None, "data": rows_file(tmp_path), "env": "math",
                            "env_args": {"timeout": 5.0}}))
