"""``sft.target``: the warm start teaches a field of each training row's info (a worked solution)
instead of its answer; the base's recipe names it only when set, so bases built before it stay usable."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("peft")

from rlvr.config.run import run_config_from_dict  # noqa: E402
from rlvr.wiring import base as warm  # noqa: E402
from rlvr.wiring.seams import make_loop  # noqa: E402

pytestmark = pytest.mark.train


def config(data_file: str, **sft) -> dict:
    return {
        "loop": {"max_steps": 1, "tasks_per_step": 2, "group_k": 2, "heldout_every": 1, "corpus_min": 20,
                 "heldout_frac": 0.2, "lr": 1e-4},
        "model": {"hidden": 16, "layers": 1, "heads": 2, "threads": 1},
        "task": {"name": None, "data": data_file, "env": "exact_match"},
        "sft": {"steps": 2, "batch_size": 4, **sft},
        "sampler": {"max_new_tokens": 3},
    }


@pytest.fixture
def taught(monkeypatch):
    """prompt -> the text the warm start was given to imitate for it."""
    seen: dict[str, str] = {}
    real = warm.sft_warm_start

    def recording(model, tokenizer, sft_rows, **kwargs):
        seen.update({r["prompt"][-1]["content"]: r["answer"] for r in sft_rows})
        return real(model, tokenizer, sft_rows, **kwargs)

    monkeypatch.setattr(warm, "sft_warm_start", recording)
    return seen


def write_rows(path: Path) -> str:
    rows = [{"prompt": f"{i}+{i}=", "answer": str(2 * i), "info": {"solution": f"{i}+{i}={2 * i}\n#### {2 * i}"}}
            for i in range(30)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def test_the_warm_start_teaches_the_named_field_and_records_it(tmp_path, taught):
    data = write_rows(tmp_path / "rows.jsonl")
    make_loop(run_config_from_dict(config(data, target="solution")), tmp_path / "run", log=lambda _m: None)
    assert taught and all(text == f"{p[:-1]}={2 * int(p.split('+')[0])}\n#### {2 * int(p.split('+')[0])}"
                          for p, text in taught.items())
    recipe = json.loads((tmp_path / "run" / "base" / "rlvr_base.json").read_text())
    assert recipe["sft"]["target"] == "solution"


def test_unset_the_answer_is_taught_and_the_recipe_is_as_before(tmp_path, taught):
    data = write_rows(tmp_path / "rows.jsonl")
    make_loop(run_config_from_dict(config(data)), tmp_path / "run", log=lambda _m: None)
    assert taught and all(text == str(2 * int(p.split("+")[0])) for p, text in taught.items())
    recipe = json.loads((tmp_path / "run" / "base" / "rlvr_base.json").read_text())
    assert "target" not in recipe["sft"]  # a base built before sft.target existed still matches
