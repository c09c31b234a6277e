"""A run never holds out rows its base or starting adapter was trained on without saying so: folders
rlvr writes record what they were trained on, a new run is checked against them before anything is
written, and `rlvr eval --data` reports its overlap with the run's rows."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlvr.data.normal import short_keys
from rlvr.data.tasks import carve, load_tasks
from rlvr.errors import ConfigError, DataError

pytest.importorskip("torch")
pytest.importorskip("peft")

from rlvr.cli.commands import main  # noqa: E402
from rlvr.config.run import run_config_from_dict  # noqa: E402
from rlvr.record.lineage import LINEAGE_FILE  # noqa: E402
from rlvr.wiring.seams import make_loop  # noqa: E402
from rlvr.wiring.tasks import task_tasks  # noqa: E402

pytestmark = pytest.mark.train

QUIET = {"log": lambda _m: None}


def rows(n: int) -> list[dict]:
    return [{"id": f"q{i}", "prompt": f"{i}+{i}=", "answer": str(2 * i)} for i in range(n)]


def write_rows(path: Path, data: list[dict]) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in data))
    return str(path)


def config(data_file: str, salt: str = "a", base: str | None = None, sft: int = 2, **model) -> dict:
    model = {**({"base": base} if base else {"hidden": 16, "layers": 1, "heads": 2}), "threads": 1, **model}
    return {"loop": {"max_steps": 1, "tasks_per_step": 2, "group_k": 2, "heldout_every": 1, "corpus_min": 20,
                     "heldout_frac": 0.25, "lr": 1e-4, "split_salt": salt, "lora_rank": 4},
            "model": model, "task": {"name": None, "data": data_file, "env": "exact_match"},
            "sft": {"steps": sft, "batch_size": 4}, "sampler": {"max_new_tokens": 2}}


def split_of(data: list[dict], salt: str):
    return carve(load_tasks(data), 0.25, salt, 20)


@pytest.fixture(scope="module")
def first_run(tmp_path_factory):
    """Run A: warm-started on the training side of split "a", one step, checkpointed."""
    root = tmp_path_factory.mktemp("lineage")
    data = write_rows(root / "rows.jsonl", rows(60))
    out = root / "a"
    make_loop(run_config_from_dict(config(data, "a")), out, **QUIET).run()
    return root, data, out


def test_every_folder_a_run_writes_records_what_it_was_trained_on(first_run):
    _, _, out = first_run
    split = split_of(rows(60), "a")
    run = json.loads((out / LINEAGE_FILE).read_text())
    assert run["train"] == run["trained_on"] == short_keys(split.train)
    assert run["heldout"] == short_keys(split.heldout)
    base = json.loads((out / "base" / LINEAGE_FILE).read_text())
    assert base["trained_on"] == short_keys(split.train)  # the SFT warm start saw the training side only


def test_a_base_warm_started_on_another_split_is_refused_naming_the_overlap(first_run):
    root, data, a = first_run
    seen = {t.id for t in split_of(rows(60), "b").heldout} & {t.id for t in split_of(rows(60), "a").train}
    assert len(seen) >= 5  # the audit's case: most of the new held-out rows were in the base's SFT set
    out = root / "b"
    with pytest.raises(ConfigError, match=rf"model.base=.* was trained on {len(seen)} of this run's 15 held-out "
                                          r"rows \(e.g. \['q\d+', .*\]; .*model.allow_heldout_overlap = true"):
        make_loop(run_config_from_dict(config(data, "b", base=str(a / "base"), sft=0)), out, **QUIET)
    assert not out.exists()  # refused before anything is written
    allowed = make_loop(run_config_from_dict(config(data, "b", base=str(a / "base"), sft=0,
                                                    allow_heldout_overlap=True)), out, **QUIET).run()
    recorded = allowed.run["heldout_overlap"]
    assert recorded["allowed"] is True and recorded["model.base"]["heldout_rows_seen"] == len(seen)
    assert set(recorded["model.base"]["heldout_ids_seen"]) <= seen
    assert allowed.run["run_config"]["model"]["allow_heldout_overlap"] is True
    # What run b was trained on carries run a's rows on, for whatever starts from b next.
    assert set(json.loads((out / LINEAGE_FILE).read_text())["trained_on"]) >= set(short_keys(split_of(rows(60),
                                                                                                      "a").train))


def test_the_same_split_passes_and_is_recorded(first_run, tmp_path):
    _, data, a = first_run
    record = make_loop(run_config_from_dict(config(data, "a", base=str(a / "base"), sft=0)), tmp_path / "c",
                       **QUIET).run()
    assert record.run["heldout_overlap"]["model.base"]["heldout_rows_seen"] == 0
    assert record.run["heldout_overlap"]["allowed"] is False


def test_a_checkpoint_or_an_export_as_the_start_is_checked_too(first_run, tmp_path):
    _, data, a = first_run
    with pytest.raises(ConfigError, match=r"model.adapter_init=.* was trained on \d+ of this run's"):
        make_loop(run_config_from_dict(config(data, "b", adapter_init=str(a / "checkpoints" / "step_000001" /
                                                                           "trainer"))), tmp_path / "d", **QUIET)
    assert main(["export", str(a), "--out", str(tmp_path / "export")]) == 0
    for folder in ("merged", "adapter", "."):
        assert (tmp_path / "export" / folder / LINEAGE_FILE).is_file()
    with pytest.raises(ConfigError, match=r"model.base=.* was trained on \d+ of this run's"):
        make_loop(run_config_from_dict(config(data, "b", base=str(tmp_path / "export" / "merged"), sft=0)),
                  tmp_path / "e", **QUIET)


def test_a_base_from_before_lineage_files_is_refused_unless_it_is_the_same_split(first_run, tmp_path):
    root, data, a = first_run
    import shutil

    old = tmp_path / "old_base"
    shutil.copytree(a / "base", old)
    (old / LINEAGE_FILE).unlink()  # as written before: only rlvr_base.json, with the split's hashes
    with pytest.raises(ConfigError, match=r"trained by rlvr on another split of rows .* cannot be counted"):
        make_loop(run_config_from_dict(config(data, "b", base=str(old), sft=0)), tmp_path / "f", **QUIET)
    make_loop(run_config_from_dict(config(data, "a", base=str(old), sft=0)), tmp_path / "g", **QUIET)


def test_eval_data_reports_its_overlap_with_the_runs_rows(first_run, tmp_path, capsys):
    _, _, a = first_run
    split = split_of(rows(60), "a")
    train, held = list(split.train)[:3], list(split.heldout)[:2]
    # Near-duplicates count: the same rows with other whitespace, case and answer types.
    mixed = ([{"prompt": " " + t.messages[-1]["content"].upper(), "answer": int(t.answer)} for t in train]
             + [{"prompt": t.messages[-1]["content"], "answer": t.answer} for t in held]
             + [{"prompt": "1000+1000=", "answer": "2000"}])
    data = write_rows(tmp_path / "eval.jsonl", mixed)
    out = tmp_path / "report.json"
    assert main(["eval", str(a), "--data", data, "--n", "1", "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["overlap"] == {"n": 6, "counted": True, "in_train": 3, "in_heldout": 2, "in_trained_on": 3}
    assert "3 are training rows of this run and 2 its held-out rows" in capsys.readouterr().err


def test_max_row_mb_reaches_the_reader(tmp_path):
    data = write_rows(tmp_path / "rows.jsonl", rows(20) + [{"prompt": "x" * 5000, "answer": "1"}])
    cfg = run_config_from_dict({**config(data), "task": {"name": None, "data": data, "env": "exact_match",
                                                         "max_row_mb": 0.001}})
    with pytest.raises(DataError, match=r"rows.jsonl line 21: longer than 1048 bytes \(task.max_row_mb\)"):
        task_tasks(cfg)


def test_resume_says_in_one_line_what_it_repaired(first_run, tmp_path, capsys):
    import shutil

    _, data, a = first_run
    out = tmp_path / "copy"
    shutil.copytree(a, out)
    newest = out / "checkpoints" / "step_000001" / "trainer" / "adapter" / "adapter_model.safetensors"
    raw = bytearray(newest.read_bytes())
    raw[-100:-36] = bytes(b ^ 0x5A for b in raw[-100:-36])
    newest.write_bytes(bytes(raw))
    (out / "config.json").write_text("{")
    assert main(["resume", str(out)]) == 0
    err = capsys.readouterr().err
    assert "rlvr: warning: checkpoint step_000001 is damaged (trainer/adapter/adapter_model.safetensors changed" in err
    assert "config.json cannot be read (JSONDecodeError); rebuilt from run.json" in err
    assert "Traceback" not in err
