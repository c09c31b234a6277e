"""A start that fails says why in one line and never strands ``--out``: a wrong model folder, a hub name
without network, ``--model.device=cuda`` on a CPU torch, a GGUF spec without its package, a reward that
raises. The same command again runs (and fails the same way, not with "already holds a run"); a reward's
error names the user's file and line, and events.jsonl keeps the full traceback."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("peft")

import torch  # noqa: E402

from rlvr.cli.commands import main  # noqa: E402
from rlvr.errors import UsageError  # noqa: E402
from rlvr.record.run_folder import check_fresh_run_dir, first_start  # noqa: E402

pytestmark = pytest.mark.train

SMALL = ["--model.hidden=32", "--model.layers=2", "--model.heads=2", "--model.threads=1", "--task.n=120",
         "--loop.max_steps=1", "--loop.heldout_every=1", "--loop.tasks_per_step=2", "--loop.group_k=2",
         "--loop.lora_rank=2", "--sampler.max_new_tokens=4", "--log.progress=off", "--watchdog.enabled=false"]


def train(out: Path, *overrides: str, capsys) -> tuple[int, list[str]]:
    """The exit code and rlvr's own lines on stderr (transformers draws progress bars there too)."""
    code = main(["train", "--out", str(out), *SMALL, *overrides])
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return code, [line for line in err.splitlines() if line.startswith("rlvr:")]


@pytest.fixture
def unreachable_hub(monkeypatch, tmp_path):
    """An empty Hugging Face cache and a hub endpoint nothing listens on: a download cannot happen."""
    constants = pytest.importorskip("huggingface_hub.constants")
    monkeypatch.setattr(constants, "ENDPOINT", "http://127.0.0.1:9")
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hf-cache"))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setenv("RLVR_HUB_RETRIES", "1")  # retried once, without waiting: the refusal comes fast
    monkeypatch.setenv("RLVR_HUB_BACKOFF_S", "0")


CASES = {
    "wrong folder": (["--model.base=/nonexistent/model"], "model.base='/nonexistent/model': no such folder"),
    "hub without network": (["--model.base=someorg/somemodel"], "cannot be reached to download it"),
    "gguf without package": (["--model.base=gguf:no_such_pkg/m.gguf"], "no installed package 'no_such_pkg'"),
    "cuda on a cpu torch": (["--model.device=cuda"], "model.device='cuda', but this torch"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_start_that_cannot_begin_fails_in_one_line_and_leaves_out_reusable(case, tmp_path, capsys,
                                                                           unreachable_hub):
    if case == "cuda on a cpu torch" and torch.cuda.is_available():
        pytest.skip("this torch has CUDA")
    overrides, expected = CASES[case]
    out = tmp_path / "run"
    for _ in range(2):  # the same command twice: the second is not refused, it fails the same way
        code, err = train(out, *overrides, capsys=capsys)
        assert code == 2
        assert len(err) == 1 and err[0].startswith("rlvr: error: ") and expected in err[0], err
        assert not out.exists()  # checked before anything was written


def test_a_reward_that_raises_names_its_line_keeps_the_traceback_and_the_folder_is_reused(tmp_path, capsys,
                                                                                        monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "rewards.py").write_text("def reward(messages, answer):\n    return 1 / 0\n")
    out = tmp_path / "run"
    for _ in range(2):
        code, err = train(out, "--task.env=rewards.py:reward", capsys=capsys)
        assert code == 2
        assert "raised ZeroDivisionError: division by zero (at rewards.py:2 in reward)" in err[0]
        assert "the same `rlvr train` command starts again" in err[1]
        failed = [json.loads(line) for line in (out / "events.jsonl").read_text().splitlines()
                  if json.loads(line)["kind"] == "failed"]
        assert len(failed) == 1 and 'rewards.py", line 2, in reward' in failed[0]["traceback"]
    (tmp_path / "rewards.py").write_text("def reward(messages, answer):\n    return 0.0\n")
    code, err = train(out, "--task.env=rewards.py:reward", capsys=capsys)
    assert code == 0, err
    assert (out / "selected.json").exists()
    with pytest.raises(UsageError, match="already holds a run"):  # a run, once checkpointed, is resume's
        check_fresh_run_dir(out)


def test_a_failure_before_run_json_removes_what_the_start_created(tmp_path):
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("kept")
    for folder in (tmp_path / "new", tmp_path / "mine"):
        with pytest.raises(RuntimeError), first_start(folder):
            folder.mkdir(exist_ok=True)
            (folder / "config.json").write_text("{}")
            (folder / "base.tmp").mkdir()
            raise RuntimeError("model failed to load")
    assert not (tmp_path / "new").exists()
    assert sorted(p.name for p in (tmp_path / "mine").iterdir()) == ["notes.txt"]
