"""``rlvr.train`` / ``rlvr.Run``: settings by key, in-memory data and rewards, the same config path as
``rlvr train``, and (slow) TRL's quickstart shapes run end to end on the tiny model from docs/notebook.md."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

import rlvr
from rlvr.cli.inputs import is_trl_reward, place_settings, table_rows
from rlvr.config.run import load_run_config
from rlvr.errors import ConfigError

DOCS = Path(__file__).resolve().parents[2] / "docs"


def rows(n: int = 120) -> list[dict]:
    return [{"prompt": f"POST {i}: it went fine.\nTL;DR:"} for i in range(n)]


def reward_len(completions, **kwargs):
    return [-abs(20 - len(completion)) for completion in completions]


def exact(messages, answer):
    return float(messages[-1]["content"].strip() == str(answer))


def test_settings_land_in_the_one_section_that_has_them():
    tree = place_settings({"max_steps": 5, "group_k": 8, "max_new_tokens": 64, "lr": 1e-4, "hidden": 32,
                           "steps": 3, "sampler": {"top_p": 0.9}, "sft.lr": 3e-3})
    assert tree == {"loop": {"max_steps": 5, "group_k": 8, "lr": 1e-4}, "sampler": {"max_new_tokens": 64, "top_p": 0.9},
                    "model": {"hidden": 32}, "sft": {"steps": 3, "lr": 3e-3}}


def test_an_ambiguous_or_unknown_setting_is_refused_naming_what_to_write():
    with pytest.raises(ConfigError, match=r"share_prompts= is a key of \[sampler\], \[train\]: say which"):
        place_settings({"share_prompts": False})
    with pytest.raises(ConfigError, match=r"rlvr.train: unknown setting learning_rate=: did you mean loop\.lr\?"):
        place_settings({"learning_rate": 1e-5})
    with pytest.raises(ConfigError, match=r"unknown setting num_generations=: did you mean loop\.group_k\?"):
        rlvr.Run("tiny", rows(), reward_len, num_generations=8)


def test_the_config_is_the_one_rlvr_train_reads(tmp_path):
    data = tmp_path / "rows.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"{i}+1=", "answer": str(i + 1)}) + "\n" for i in range(120)))
    run = rlvr.Run("tiny", str(data), "exact_match", max_steps=3, group_k=2, max_new_tokens=4, out=tmp_path / "r")
    cli = load_run_config(None, [f"--task.data={data}", "--task.env=exact_match", "--loop.max_steps=3",
                                 "--loop.group_k=2", "--sampler.max_new_tokens=4"])
    assert run.config.model_dump() == cli.model_dump()


def test_in_memory_rows_and_functions_are_named_as_session_specs():
    cfg = rlvr.Run("tiny", rows(), [reward_len, exact], reward_weights=[1.0, 0.5]).config
    assert cfg.task.data == "session:data"
    assert cfg.task.rewards == ["trl:session:reward_len", "session:exact"]
    assert cfg.task.reward_weights == [1.0, 0.5]
    assert rlvr.Run("tiny", rows(), exact).config.task.env == "session:exact"


def test_trl_and_rlvr_rewards_are_told_apart_by_their_parameters():
    assert is_trl_reward(reward_len) and is_trl_reward(lambda prompts, completions, **kw: [])
    assert is_trl_reward(lambda **kwargs: [])
    assert not is_trl_reward(exact) and not is_trl_reward(lambda messages, answer, info: 0.0)


def test_data_needs_a_reward_and_a_dataset_dict_needs_a_split():
    with pytest.raises(ConfigError, match="data= needs reward="):
        rlvr.Run("tiny", rows())
    assert rlvr.Run("tiny", rows(), env="exact_match").config.task.env == "exact_match"  # a reward by key

    class DatasetDict(dict):
        pass

    with pytest.raises(ConfigError, match=r"DatasetDict with the splits \['test', 'train'\]; give one split"):
        table_rows(DatasetDict(train=[], test=[]))


def test_pandas_and_datasets_tables_become_plain_rows():
    pd = pytest.importorskip("pandas")
    frame = pd.DataFrame({"prompt": ["a", "b"], "answer": [1.0, float("nan")], "n": [3, 4]})
    assert table_rows(frame) == [{"prompt": "a", "answer": 1.0, "n": 3}, {"prompt": "b", "n": 4}]
    assert type(table_rows(frame)[0]["n"]) is int  # numpy scalars become Python ones (JSON, content hashes)
    datasets = pytest.importorskip("datasets")
    ds = datasets.Dataset.from_list([{"prompt": [{"role": "user", "content": "hi"}], "k": 1}])
    assert table_rows(ds) == [{"prompt": [{"role": "user", "content": "hi"}], "k": 1}]


TINY = {"hidden": 32, "layers": 2, "heads": 2, "threads": 1, "group_k": 2, "tasks_per_step": 2, "lora_rank": 2,
        "max_new_tokens": 8, "progress": "off", "max_steps": 1}


def trl_math_rows(n: int = 120) -> list[dict]:
    """TRL's shape as a dataset has it: a conversational prompt and a solution column, no answer, no fields."""
    return [{"prompt": [{"role": "user", "content": f"What is {i} + {i}? Answer in \\boxed{{}}."}],
             "solution": f"${2 * i}$"} for i in range(n)]


@pytest.mark.train
def test_trls_accuracy_reward_gets_its_solution_column_with_no_fields(tmp_path):
    pytest.importorskip("torch")
    datasets = pytest.importorskip("datasets")
    seen: list = []

    def accuracy_reward(completions, solution, **kwargs):  # TRL's canonical signature
        seen.extend(solution)
        return [float(sol.strip("$") in c[0]["content"]) for c, sol in zip(completions, solution, strict=True)]

    record = rlvr.train("tiny", datasets.Dataset.from_list(trl_math_rows()), accuracy_reward, out=tmp_path / "r",
                        **TINY)
    assert record.finished.data["stop_cause"] == "max_steps"
    assert seen and all(s.startswith("$") and s.endswith("$") for s in seen)  # held-out rows and training rows


@pytest.mark.train
def test_trls_own_accuracy_reward_runs_unchanged(tmp_path):
    pytest.importorskip("torch")
    pytest.importorskip("math_verify")
    rewards = pytest.importorskip("trl.rewards")
    record = rlvr.train("tiny", trl_math_rows(), rewards.accuracy_reward, out=tmp_path / "r", **TINY)
    assert record.finished.data["stop_cause"] == "max_steps" and record.heldout_scores


def notebook_blocks() -> list[str]:
    return re.findall(r"<!-- tested -->\n```python\n(.*?)```", (DOCS / "notebook.md").read_text(), re.S)


@pytest.mark.train
@pytest.mark.slow
@pytest.mark.parametrize("block", [0, 1], ids=["tldr-shape-prompt-only", "conversational-two-weighted-rewards"])
def test_the_notebook_page_runs_trl_quickstart_shapes_with_zero_glue(block, tmp_path, monkeypatch):
    pytest.importorskip("torch")
    monkeypatch.chdir(tmp_path)
    code = notebook_blocks()[block]
    assert code.count("rlvr.train(") == 1  # one call: no config file, no files on disk, no adapter code
    exec(compile(code, str(DOCS / "notebook.md"), "exec"), {})
    out = next((tmp_path / "runs").iterdir())
    record = rlvr.read_record(out)
    assert record.finished.data["stop_cause"] == "max_steps"
    assert (out / record.selected["checkpoint"]).is_dir()
    config = json.loads((out / "config.json").read_text())
    assert config["task"]["data"] == "session:data" and record.run["split"]["n_heldout"] > 0
    if block == 1:
        metrics = [m for m in record.metrics if "reward/short" in m]
        assert metrics and all("reward/no_digits" in m for m in metrics)
        assert config["task"]["reward_weights"] == [1.0, 0.5]


@pytest.mark.train
@pytest.mark.slow
def test_a_run_started_from_python_is_resumed_from_python(tmp_path):
    pytest.importorskip("torch")
    small = {"hidden": 32, "layers": 2, "heads": 2, "group_k": 2, "tasks_per_step": 2, "heldout_every": 2,
             "lora_rank": 2, "progress": "off", "out": tmp_path / "run"}
    first = rlvr.train("tiny", rows(), reward_len, max_steps=2, **small)
    assert first.finished.data["stop_cause"] == "max_steps" and max(first.pool_scores) == 2
    with pytest.raises(ConfigError, match=r"resume=True: .* holds a run with other settings \(loop\.group_k\)"):
        rlvr.Run("tiny", rows(), reward_len, max_steps=4, resume=True, **{**small, "group_k": 4}).train()
    again = rlvr.train("tiny", rows(), reward_len, max_steps=4, resume=True, **small)
    assert max(again.pool_scores) == 4 and sorted(again.heldout_scores) == [0, 2, 4]
    assert any(e.kind == "resumed" for e in again.events)
