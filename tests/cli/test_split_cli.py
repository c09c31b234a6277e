"""`rlvr split CONFIG` shows the split `rlvr train` would carve, its clusters and conflicting answers,
without training; `rlvr train` says the same summary line at start and run.json records it; a base
trained on near-duplicates of a run's held-out rows is refused as one trained on the rows."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlvr.data.tasks import carve
from rlvr.errors import ConfigError

pytest.importorskip("torch")
pytest.importorskip("peft")

from rlvr.cli.commands import main  # noqa: E402
from rlvr.config.run import run_config_from_dict  # noqa: E402
from rlvr.wiring.seams import make_loop  # noqa: E402
from rlvr.wiring.tasks import task_tasks  # noqa: E402

pytestmark = pytest.mark.train


def twin_rows(n: int) -> list[dict]:
    """``n`` sums, each also with a zero-width space and its answer boxed, and every fourth quoted in a
    few-shot prompt."""
    rows = []
    for i in range(n):
        prompt = f"What is {i} plus {i + 7}?"
        rows += [{"prompt": prompt, "answer": str(2 * i + 7)},
                 {"prompt": prompt.replace("What", "Wh\u200bat"), "answer": f"\\boxed{{{2 * i + 7}}}"}]
        if i % 4 == 0:
            rows.append({"prompt": f"Q: What is 1 plus 1?\nA: 2\n\nQ: {prompt}\nA:", "answer": str(2 * i + 7)})
    return rows


def write_rows(path: Path, data: list[dict]) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in data))
    return str(path)


def config(data_file: str, salt: str = "a", base: str | None = None, sft: int = 0, **model) -> dict:
    model = {**({"base": base} if base else {"hidden": 16, "layers": 1, "heads": 2}), "threads": 1, **model}
    return {"loop": {"max_steps": 1, "tasks_per_step": 2, "group_k": 2, "heldout_every": 1, "corpus_min": 20,
                     "heldout_frac": 0.25, "lr": 1e-4, "split_salt": salt, "lora_rank": 4},
            "model": model, "task": {"name": None, "data": data_file, "env": "exact_match"},
            "sft": {"steps": sft, "batch_size": 4}, "sampler": {"max_new_tokens": 2}}


def toml_config(tmp_path: Path, data: str) -> str:
    path = tmp_path / "run.toml"
    path.write_text(f'[task]\nname = ""\ndata = "{data}"\nenv = "exact_match"\n[loop]\ncorpus_min = 20\n'
                    'heldout_frac = 0.25\nsplit_salt = "a"\n')
    return str(path)


def test_rlvr_split_prints_the_split_train_would_carve(tmp_path, capsys):
    data = write_rows(tmp_path / "rows.jsonl", twin_rows(40))
    cfg = toml_config(tmp_path, data)
    assert main(["split", cfg]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("split (prompt_twins): 90 rows -> ")
    assert "50 distinct prompts in 40 clusters" in out[0] and "40 prompts with conflicting answers" in out[0]
    assert any("quoted:" in line or "same prompt:" in line for line in out[1:6])
    assert any(line.startswith("  conflicting answers for ") and "\\\\boxed{" in line for line in out)
    assert main(["split", cfg, "--json", "--loop.split_salt=b"]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [x["line"] for x in lines] == list(range(90))
    split = carve(task_tasks(run_config_from_dict(config(data, salt="b")))[0], 0.25, "b", 20)
    assert sum(x["side"] == "heldout" for x in lines) == len(split.heldout)
    by_cluster: dict[str, set[str]] = {}
    for x in lines:
        by_cluster.setdefault(x["cluster"], set()).add(x["side"])
    assert len(by_cluster) == 40 and all(len(sides) == 1 for sides in by_cluster.values())


def test_rlvr_split_says_when_train_would_refuse(tmp_path, capsys):
    data = write_rows(tmp_path / "rows.jsonl", twin_rows(5))
    assert main(["split", toml_config(tmp_path, data)]) == 2
    assert "below corpus_min=20" in capsys.readouterr().err


def test_train_says_the_split_at_start_and_records_it(tmp_path):
    data = write_rows(tmp_path / "rows.jsonl", twin_rows(40))
    said: list[str] = []
    record = make_loop(run_config_from_dict(config(data)), tmp_path / "run", log=said.append).run()
    assert any(line.startswith("rlvr: split (prompt_twins): 90 rows -> ") for line in said)
    assert record.run["split"]["split_by"] == "prompt_twins"
    assert record.run["split"]["summary"]["clusters"] == 40


def test_a_base_trained_on_twins_of_the_heldout_rows_is_refused(tmp_path):
    plain = [{"prompt": f"{i} plus {i} makes how much", "answer": str(2 * i)} for i in range(60)]
    first = tmp_path / "a"
    make_loop(run_config_from_dict(config(write_rows(tmp_path / "a.jsonl", plain), sft=2)), first,
              log=lambda _m: None).run()
    # The same questions, each with an instruction after it: no row has the same normal prompt.
    suffixed = [{"prompt": r["prompt"] + ". Reply with digits only.", "answer": r["answer"]} for r in plain]
    cfg = config(write_rows(tmp_path / "b.jsonl", suffixed), salt="b", base=str(first / "base"))
    with pytest.raises(ConfigError, match=r"was trained on \d+ of this run's 15 held-out rows \(e.g. .*; \d+ of them "
                                          r"as near-duplicates; by "):
        make_loop(run_config_from_dict(cfg), tmp_path / "b", log=lambda _m: None)
