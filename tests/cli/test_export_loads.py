"""An export loads anywhere its base is: the adapter names the hub model (here one in a Hugging Face
cache of its own, read with the hub offline) and ``AutoPeftModelForCausalLM`` loads it from another
folder, equal to ``merged/``; the card names the data as it came (an environment file's own rows);
and no exported file holds a path of the machine that made it."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("peft")

from rlvr.backends.model.tiny import build_tiny_model  # noqa: E402
from rlvr.cli.commands import main  # noqa: E402

pytestmark = pytest.mark.train

SRC = Path(__file__).resolve().parents[2] / "src"
REVISION = "0123456789abcdef0123456789abcdef01234567"
ENV = '''
def make_rows(n, seed=0):
    return [{"prompt": f"{i}+1=", "answer": str(i + 1)} for i in range(n)]


def reward_fn(messages, answer):
    return float(messages[-1]["content"].strip() == str(answer))
'''


def cached_model(hf_home: Path, repo: str) -> Path:
    """A tiny model saved as the hub client caches a download: hub/models--ORG--NAME/snapshots/REV, refs/main."""
    entry = hf_home / "hub" / f"models--{repo.replace('/', '--')}"
    snapshot = entry / "snapshots" / REVISION
    build_tiny_model(snapshot, hidden=32, layers=2, heads=2, seed=0)
    (entry / "refs").mkdir(parents=True)
    (entry / "refs" / "main").write_text(REVISION)
    return snapshot


def test_an_exported_adapter_loads_over_its_hub_base_from_the_cache(tmp_path):
    hf_home = tmp_path / "hf-home"
    snapshot = cached_model(hf_home, "rlvr-test/tiny-chat")
    work = tmp_path / "work"
    work.mkdir()
    (work / "myenv.py").write_text(ENV)
    code = main(["train", "--out", str(work / "run"), f"--model.base={snapshot}", f"--task.env={work / 'myenv.py'}",
                 "--task.n=120", "--model.threads=1", "--loop.max_steps=1", "--loop.tasks_per_step=2",
                 "--loop.group_k=2", "--loop.lora_rank=2", "--sampler.max_new_tokens=4", "--log.progress=off",
                 "--watchdog.enabled=false", "--train.micro_batch=64"])
    assert code == 0
    assert main(["export", str(work / "run"), "--out", str(work / "export")]) == 0
    export = work / "export"
    assert json.loads((export / "adapter" / "adapter_config.json").read_text())["base_model_name_or_path"] == \
        "rlvr-test/tiny-chat"
    card = (export / "README.md").read_text()
    assert "base_model: rlvr-test/tiny-chat" in card
    assert "- data: rows made by the environment myenv.py (n = 120, seed = 0)" in card and "procedural" not in card
    for file in export.rglob("*"):
        if file.is_file() and file.suffix in (".json", ".md", ".jinja", ".txt"):
            text = file.read_text(encoding="utf-8")
            assert str(tmp_path) not in text and sys.prefix not in text, file

    elsewhere = tmp_path / "elsewhere"  # the export moved away from the run and its machine's paths
    shutil.copytree(export, elsewhere)
    script = textwrap.dedent("""
        import torch
        from peft import AutoPeftModelForCausalLM
        from transformers import AutoModelForCausalLM
        model = AutoPeftModelForCausalLM.from_pretrained("adapter").merge_and_unload()
        merged = AutoModelForCausalLM.from_pretrained("merged")
        a, b = model.state_dict(), merged.state_dict()
        assert a.keys() == b.keys()
        print(max((a[k] - b[k]).abs().max().item() for k in a))
    """)
    env = {**os.environ, "HF_HOME": str(hf_home), "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(SRC)}
    env.pop("HF_HUB_CACHE", None)
    done = subprocess.run([sys.executable, "-c", script], cwd=elsewhere, env=env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert float(done.stdout.strip().splitlines()[-1]) < 1e-5
