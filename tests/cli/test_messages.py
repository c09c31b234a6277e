"""Careless input gets one line that names the problem, never a traceback: bad config files, bad
task parameters, impossible model sizes, unusable --out folders, a full disk mid-checkpoint,
``rlvr serve`` on nothing, prompts the model cannot take, malformed token-id rows and CSV."""

from __future__ import annotations

import errno
import json
from pathlib import Path

import pytest

from conftest import make_rig, small_config
from rlvr.cli.commands import main
from rlvr.config.run import load_run_config, run_config_from_dict
from rlvr.data.readers import load_rows
from rlvr.data.tasks import load_tasks
from rlvr.errors import ConfigError, DataError, RecordError


def run_cli(capsys, *argv: str) -> tuple[int, str]:
    code = main(list(argv))
    return code, capsys.readouterr().err


def test_a_config_that_is_not_utf8_or_is_a_folder_is_named(tmp_path):
    bad = tmp_path / "latin1.toml"
    bad.write_bytes('[loop]\nsplit_salt = "caf\xe9"\n'.encode("latin-1"))
    with pytest.raises(ConfigError, match=r"latin1.toml: not UTF-8 text \(byte 0xe9 at offset \d+\); save the config"):
        load_run_config(bad)
    with pytest.raises(ConfigError, match="is a folder; give the TOML file inside it"):
        load_run_config(tmp_path)


def test_model_sizes_that_cannot_build_a_model_are_refused_at_load():
    with pytest.raises(ConfigError, match=r"(?s)\[model\].*hidden=30 must be a multiple of heads=4"):
        run_config_from_dict({"model": {"hidden": 30, "heads": 4}})


def test_prompt_ids_are_checked_when_the_row_is_loaded():
    for bad in (["a"], [], [1, -2], [True], "123"):
        with pytest.raises(DataError, match=r"bench row 0: field 'info.prompt_ids' must be a non-empty list"):
            load_tasks([{"prompt": "x", "answer": "1", "info": {"prompt_ids": bad}}])
    assert load_tasks([{"prompt": "x", "answer": "1", "info": {"prompt_ids": [1, 2]}}])[0].info["prompt_ids"] == [1, 2]


def test_an_unterminated_csv_quote_is_named_as_such(tmp_path):
    path = tmp_path / "rows.csv"
    path.write_text('prompt,answer\n1+1=,2\n"2+2=,4\n3+3=,6\n')
    with pytest.raises(DataError, match=r"rows.csv line 3: not valid CSV .*a quote opened on or after this line"):
        load_rows(path)


def test_out_that_is_a_file_or_unwritable_is_one_line(tmp_path, capsys):
    pytest.importorskip("torch")
    (tmp_path / "file").write_text("x")
    code, err = run_cli(capsys, "train", "--out", str(tmp_path / "file"))
    assert code == 2 and "is a file, not a folder" in err and "Traceback" not in err


def test_rlvr_serve_on_nothing_or_a_bad_port_is_one_line(tmp_path, capsys):
    code, err = run_cli(capsys, "serve", str(tmp_path / "missing"))
    assert code == 2 and "is not a folder" in err and "Traceback" not in err
    with pytest.raises(SystemExit) as exit_info:
        main(["serve", str(tmp_path), "--port", "99999"])
    assert exit_info.value.code == 2 and "99999 is outside 1-65535" in capsys.readouterr().err


def test_a_full_disk_during_a_checkpoint_is_a_record_error_and_the_run_resumes(tmp_path):
    cfg = small_config(max_steps=4, heldout_every=2)

    class FullDisk:
        def __init__(self, trainer, at):
            self.trainer, self.at = trainer, at

        def __getattr__(self, name):
            return getattr(self.trainer, name)

        def __call__(self, batch):
            return self.trainer(batch)

        def save(self, path):
            if self.trainer.version == self.at:
                raise OSError(errno.ENOSPC, "No space left on device")
            self.trainer.save(path)

        def load(self, path):
            self.trainer.load(path)

    rig = make_rig(cfg, out_dir=tmp_path)
    rig.loop.trainer = FullDisk(rig.trainer, at=2)
    with pytest.raises(RecordError, match=r"checkpoints/step_000002 failed: No space left on device; the last "
                                          r"complete one is step 0: free space"):
        rig.loop.run()
    assert not list((tmp_path / "checkpoints").glob("*.tmp"))  # the half-written one is gone
    assert json.loads((tmp_path / "checkpoints" / "step_000000" / "loop_state.json").read_text())["step"] == 0
    record = make_rig(cfg, out_dir=tmp_path).loop.run(resume=True)
    assert record.finished.data["stop_cause"] == "max_steps"


@pytest.fixture
def tiny_config(tmp_path):
    pytest.importorskip("torch")
    pytest.importorskip("peft")

    def build(task: dict, **loop) -> dict:
        return {"loop": {"max_steps": 1, "tasks_per_step": 2, "group_k": 2, "heldout_every": 1, "corpus_min": 20,
                         "heldout_frac": 0.2, **loop},
                "model": {"hidden": 16, "layers": 1, "heads": 2, "threads": 1},
                "task": task, "sft": {"steps": 0}, "sampler": {"max_new_tokens": 4}}

    return build


def test_bad_task_params_are_named(tmp_path, tiny_config):
    from rlvr.wiring.seams import make_loop

    cfg = run_config_from_dict(tiny_config({"name": "addition", "n": 40, "params": {"digits": "two"}}))
    with pytest.raises(ConfigError, match=r"task.params=\{'digits': 'two'\}: the rows of 'addition' cannot be made"):
        make_loop(cfg, tmp_path / "run", log=lambda _m: None)
    assert not (tmp_path / "run").exists()  # refused before anything was written


def test_a_prompt_longer_than_the_context_is_refused_at_load(tmp_path, tiny_config):
    from rlvr.wiring.seams import make_loop

    rows = [{"prompt": f"{i}+{i}=" + " " * (300 if i == 7 else 0), "answer": str(2 * i)} for i in range(30)]
    data = Path(tmp_path / "rows.jsonl")
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = run_config_from_dict(tiny_config({"name": None, "data": str(data), "env": "exact_match"}))
    with pytest.raises(ConfigError, match=r"row '[0-9a-f]+': its prompt is \d+ tokens, and with "
                                          r"sampler.max_new_tokens=4 that exceeds the model's context of 256"):
        make_loop(cfg, tmp_path / "run", log=lambda _m: None)
