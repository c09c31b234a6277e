"""`rlvr train` on data in the field's usual shapes (GSM8K, TRL) with one `fields` line, a TRL reward used
unchanged, the [task] keys that say so, and a GGUF-only model folder named for what it is."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlvr.config.run import run_config_from_dict
from rlvr.errors import ConfigError

pytest.importorskip("torch")
pytest.importorskip("peft")

from rlvr.backends.model.sources import resolve_base  # noqa: E402
from rlvr.cli.commands import main  # noqa: E402
from rlvr.record.run_record import read_record  # noqa: E402
from rlvr.wiring.tasks import task_tasks  # noqa: E402

pytestmark = pytest.mark.train

REWARDS = Path(__file__).parents[1] / "envs" / "trl_style_rewards.py"


def gsm8k_rows(n: int) -> list[dict]:
    return [{"question": f"{i}+{i}=", "answer": f"{i} plus {i} is {2 * i}.\n#### {2 * i:,}"} for i in range(n)]


def trl_rows(n: int) -> list[dict]:
    return [{"prompt": [{"role": "user", "content": f"{i}+{i}="}], "solution": str(2 * i)} for i in range(n)]


SHAPES = {
    "gsm8k": (gsm8k_rows, {"fields": {"prompt": "question"}, "answer_extract": "####", "env": "exact_match"}),
    "trl": (trl_rows, {"fields": {"answer": "solution"}, "rewards": [f"trl:{REWARDS}:accuracy_reward",
                                                                     f"trl:{REWARDS}:digits_reward"],
                       "reward_weights": [1.0, 0.5]}),
}


def write(path: Path, rows: list[dict]) -> str:
    if path.suffix == ".parquet":
        pa = pytest.importorskip("pyarrow")
        pq = pytest.importorskip("pyarrow.parquet")
        pq.write_table(pa.Table.from_pylist(rows), path)
    else:
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def toml_value(value) -> str:
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k} = {toml_value(v)}" for k, v in value.items()) + "}"
    return json.dumps(value)


def config_file(tmp_path: Path, data: str, task: dict) -> str:
    task_lines = "\n".join(f"{key} = {toml_value(value)}" for key, value in {"name": "", "data": data,
                                                                           **task}.items())
    text = f"""
[loop]
max_steps = 2
tasks_per_step = 2
group_k = 2
heldout_every = 2
corpus_min = 20
heldout_frac = 0.2
lr = 1e-4
[model]
tiny = true
hidden = 16
layers = 1
heads = 2
threads = 1
[task]
{task_lines}
[sft]
steps = 2
batch_size = 4
[sampler]
max_new_tokens = 3
""".replace('name = ""\n', "")
    path = tmp_path / "run.toml"
    path.write_text(text)
    return str(path)


@pytest.mark.parametrize("suffix", [".jsonl", ".parquet"])
@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_rows_in_the_field_s_shapes_train_to_a_complete_record(tmp_path, shape, suffix):
    make, task = SHAPES[shape]
    data = write(tmp_path / f"rows{suffix}", make(30))
    out = tmp_path / "run"
    assert main(["train", config_file(tmp_path, data, task), "--out", str(out)]) == 0
    record = read_record(out)
    config = json.loads((out / "config.json").read_text())
    assert config["task"]["fields"] == task["fields"]
    assert record.run["split"]["n_train"] + record.run["split"]["n_heldout"] == 30
    assert record.finished is not None and record.selected is not None and 0 in record.heldout_scores
    steps = [m for m in record.metrics if "step" in m]
    assert len(steps) == 2
    if shape == "trl":  # each TRL reward function is logged as a component, as TRL logs each mean
        assert {"reward/accuracy_reward", "reward/digits_reward"} <= set(steps[-1])


def test_mapped_answers_reach_the_reward_extracted(tmp_path):
    data = write(tmp_path / "g.jsonl", gsm8k_rows(25))
    cfg = run_config_from_dict({"task": {"name": None, "data": data, "env": "exact_match",
                                         **{k: v for k, v in SHAPES["gsm8k"][1].items() if k != "env"}}})
    tasks, env = task_tasks(cfg)
    assert tasks[12].answer == "24" and tasks[12].info["answer"].endswith("#### 24")
    assert cfg.task.answer_extract == "####"


def test_task_keys_are_checked_at_load(tmp_path):
    data = write(tmp_path / "g.jsonl", gsm8k_rows(25))

    def build(**task):
        return task_tasks(run_config_from_dict({"task": {"name": None, "data": data, **task}}))

    with pytest.raises(ValueError, match="task.rewards replaces task.env"):
        build(env="exact_match", rewards=["exact_match"])
    with pytest.raises(ValueError, match="1 weights for 2"):
        build(rewards=["exact_match", "exact_match"], reward_weights=[1.0])
    with pytest.raises(ConfigError, match=r"task.fields: \['question'\] name no target"):
        build(env="exact_match", fields={"question": "prompt"})
    with pytest.raises(ConfigError, match="answer_extract='hashes'"):
        build(env="exact_match", fields={"prompt": "question"}, answer_extract="hashes")
    with pytest.raises(ConfigError, match="'trl:' prefix"):
        build(env=f"{REWARDS}:accuracy_reward", fields={"prompt": "question"})


def test_a_folder_holding_only_a_gguf_file_names_it(tmp_path):
    folder = tmp_path / "smol"
    folder.mkdir()
    (folder / "SmolLM2.Q4.gguf").write_bytes(b"GGUF")
    with pytest.raises(ConfigError, match=r"holds a GGUF file SmolLM2.Q4.gguf.*"
                                          r"set model.base = '.*smol/SmolLM2.Q4.gguf'"):
        resolve_base(str(folder))
    (folder / "config.json").write_text("{}")
    assert resolve_base(str(folder)).path == str(folder)  # a real model folder is left alone


def test_the_data_page_examples_are_valid_configs():
    import re
    import tomllib

    page = (Path(__file__).parents[2] / "docs" / "environments.md").read_text()
    section = page.split("## Data and rewards as you have them", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```toml\n(.*?)```", section, re.S)
    assert len(blocks) == 3
    for block in blocks:
        task = run_config_from_dict(tomllib.loads(block)).task
        assert task.fields and (task.env or task.rewards)
