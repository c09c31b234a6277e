"""Unknown config keys get the rlvr key they most likely mean: TRL and verl names, keys of another
section, typos; the name tables point only at keys that exist and the docs print every entry."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlvr.cli.commands import main
from rlvr.config.foreign_names import TRL_NAMES, VERL_NAMES, suggest
from rlvr.config.run import load_run_config, run_config_from_dict, section_keys
from rlvr.errors import ConfigError

DOCS = Path(__file__).resolve().parents[2] / "docs"


def test_every_rlvr_key_the_tables_name_exists():
    known = section_keys()
    for table in (TRL_NAMES, VERL_NAMES):
        for foreign, (target, note) in table.items():
            assert target is not None or note, foreign
            if target is not None:
                section, key = target.split(".")
                assert key in known[section], f"{foreign} -> {target}"


@pytest.mark.parametrize("page, table", [("coming_from_trl.md", TRL_NAMES), ("coming_from_verl.md", VERL_NAMES)])
def test_the_docs_print_every_name(page, table):
    text = (DOCS / page).read_text()
    for foreign, (target, _) in table.items():
        assert f"`{foreign}`" in text, foreign
        if target is not None:
            assert f"`{target}`" in text, target


@pytest.mark.parametrize("overrides, expected", [
    (["--loop.learning_rate=1e-5"], "loop.learning_rate: did you mean loop.lr? (TRL's learning_rate)"),
    (["--loop.beta=0.04"], "did you mean loop.kl_coef?"),
    (["--loop.num_generations=8"], "did you mean loop.group_k?"),
    (["--loop.per_device_train_batch_size=8"], "did you mean train.micro_batch?"),
    (["--loop.max_completion_length=256"], "did you mean sampler.max_new_tokens?"),
    (["--actor_rollout_ref.actor.optim.lr=1e-6"], "did you mean loop.lr? (verl's actor_rollout_ref.actor.optim.lr)"),
    (["--actor_rollout_ref.rollout.n=8"], "did you mean loop.group_k?"),
    (["--loop.kl_loss_coef=0.001"], "did you mean loop.kl_coef? (verl's kl_loss_coef)"),
    (["--loop.max_new_tokens=64"], "loop.max_new_tokens: did you mean sampler.max_new_tokens?"),
    (["--loop.group_kk=4"], "did you mean loop.group_k?"),
    (["--learning_rate=1e-5"], "command line: unknown key --learning_rate: did you mean loop.lr?"),
    (["--loop.max_prompt_length=512"], "TRL's max_prompt_length has no rlvr key: rlvr never truncates a prompt"),
])
def test_foreign_names_are_answered_with_rlvrs_key(overrides, expected):
    with pytest.raises(ConfigError) as err:
        load_run_config(None, overrides)
    assert expected in str(err.value)
    assert "Extra inputs" not in str(err.value)


def test_several_unknown_keys_are_named_in_one_line():
    with pytest.raises(ConfigError) as err:
        run_config_from_dict({"loop": {"learning_rate": 1e-5, "beta": 0.0}, "nosuch": {"x": 1}})
    message = str(err.value)
    assert "\n" not in message
    assert "loop.learning_rate: did you mean loop.lr?" in message and "loop.beta: did you mean loop.kl_coef?" in message
    assert "nosuch.x: no section [nosuch]" in message


def test_an_environment_key_is_suggested_within_its_environment():
    with pytest.raises(ConfigError, match=r"envs\.a\.rewardz: did you mean envs\.a\.rewards\?"):
        run_config_from_dict({"envs": {"a": {"rewardz": []}}})


def test_nothing_close_gets_no_guess():
    assert suggest("loop.zzzzzz", section_keys()) is None


def test_the_cli_prints_the_suggestion_in_one_line(capsys):
    assert main(["train", "--loop.learning_rate=1e-5", "--out", "/nonexistent/never-written"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["rlvr: error: command line: unknown key --loop.learning_rate: did you mean loop.lr? (TRL's "
                   "learning_rate)"]


# What each foreign name means in its own framework, checked against TRL's GRPOConfig and verl's
# ppo_trainer.yaml: the entries a hint once got wrong or lacked.
MEANINGS = {
    "num_iterations": "train.update_epochs",  # TRL: passes over each generated batch (mu)
    "steps_per_generation": "train.ppo_n_minibatches",  # TRL: optimizer steps per generation
    "per_device_train_batch_size": "train.micro_batch",  # TRL: completions per forward-backward on a device
    "gradient_accumulation_steps": "train.micro_batch",
    "generation_batch_size": "loop.tasks_per_step",
    "vllm_mode": "sampler.backend",
    "vllm_gpu_memory_utilization": "sampler.vllm_kv_cache_gib",
    "vllm_importance_sampling_clip_max": "train.tis_cap",
    "push_to_hub": None,
    "actor_rollout_ref.actor.ppo_epochs": "train.update_epochs",
    "actor_rollout_ref.rollout.tensor_model_parallel_size": "sampler.vllm_args",
    "actor_rollout_ref.rollout.gpu_memory_utilization": "sampler.vllm_kv_cache_gib",
    "data.filter_overlong_prompts": None,
    "actor_rollout_ref.actor.fsdp_config.param_offload": "train.offload",
    "actor_rollout_ref.actor.fsdp_config.optimizer_offload": "train.offload",
    "actor_rollout_ref.ref.fsdp_config.param_offload": "train.reference_on_cpu",
}
ENTRIES = [("TRL", k, v) for k, v in TRL_NAMES.items()] + [("verl", k, v) for k, v in VERL_NAMES.items()]


@pytest.mark.parametrize("framework, foreign, entry", ENTRIES, ids=[e[1] for e in ENTRIES])
def test_each_table_entry_is_answered_and_printed(framework, foreign, entry):
    target, note = entry
    where = foreign if framework == "verl" else f"model.{foreign}"  # a TRL name written in a section without it
    hint = suggest(where, section_keys())
    assert hint is not None, foreign
    if target is None:
        assert f"{foreign} has no rlvr key: {note}" in hint
    else:
        assert hint.startswith(f"did you mean {target}") or f" {target}" in hint, (foreign, hint)
    if foreign in MEANINGS:
        assert target == MEANINGS[foreign], foreign
    page = DOCS / ("coming_from_trl.md" if framework == "TRL" else "coming_from_verl.md")
    row = f"| `{foreign}` | {f'`{target}`' if target else '—'} | {note.replace('|', '/')} |"
    assert row in page.read_text().splitlines(), row


def described_names() -> dict[tuple[str, str], set[str]]:
    """(framework, name) → the rlvr keys whose own description names it (``TRL `num_iterations```)."""
    import re

    from rlvr.config.run import RunConfig

    claims: dict[tuple[str, str], set[str]] = {}
    for section, field in RunConfig.model_fields.items():
        for key, info in getattr(field.annotation, "model_fields", {}).items():
            for framework, names in re.findall(r"(TRL|verl):? ((?:`[^`]+`(?:,? (?:or |and )?)?)+)",
                                               info.description or ""):
                for name in re.findall(r"`([^`]+)`", names):
                    claims.setdefault((framework, name), set()).add(f"{section}.{key}")
    return claims


NOT_CONFIG_KEYS = {"lr_scheduler_kwargs.min_lr_rate", "lr_scheduler_kwargs.num_decay_steps", "soft_punish_cache",
                   "report_to='wandb'", "trainer.logger=['wandb']", "policy_loss.dro_beta"}


def test_the_tables_agree_with_what_each_rlvr_key_says_it_is():
    for (framework, name), keys in described_names().items():
        if name in NOT_CONFIG_KEYS:
            continue
        table = TRL_NAMES if framework == "TRL" else VERL_NAMES
        entries = {k: v for k, v in table.items() if k == name or k.endswith("." + name)}
        assert entries, f"{framework} {name} (named by {sorted(keys)}) has no entry in the table"
        for foreign, (target, _) in entries.items():
            assert target in keys, f"{foreign} -> {target}, but {sorted(keys)} say they are {framework}'s {name}"


def test_every_trl_name_is_a_field_of_trls_configs():
    trl = pytest.importorskip("trl")
    import dataclasses

    fields = {f.name for cls in (trl.GRPOConfig, trl.ModelConfig, trl.ScriptArguments) for f in dataclasses.fields(cls)}
    elsewhere = {"max_prompt_length": "GRPOConfig before TRL 1.0", "warmup_ratio": "TrainingArguments before v5",
                 "reward_funcs": "GRPOTrainer's argument", "cliprange_value": "PPOConfig", "vf_coef": "PPOConfig"}
    assert sorted(set(TRL_NAMES) - fields - set(elsewhere)) == []


@pytest.mark.parametrize("typo, expected", [
    ("lerning_rate", "did you mean loop.lr? (lerning_rate looks like TRL's learning_rate)"),
    ("loop.num_generaitons", "did you mean loop.group_k? (num_generaitons looks like TRL's num_generations"),
    ("loop.gradient_acumulation_steps", "did you mean train.micro_batch?"),
    ("actor_rollout_ref.rollout.tensor_model_paralel_size", "did you mean sampler.vllm_args?"),
])
def test_a_misspelt_foreign_name_is_read_as_the_name(typo, expected):
    assert expected in suggest(typo, section_keys())


def test_every_unknown_key_of_a_run_is_named_at_once_under_where_it_was_written(tmp_path):
    base = tmp_path / "base.toml"
    base.write_text("[loop]\nlearning_rate = 1e-5\nnum_iterations = 2\n[trainer]\ntotal_epochs = 3\n")
    with pytest.raises(ConfigError) as err:
        load_run_config(base, ["--loop.beta=0.1", "--vllm_mode=colocate", "--sampler.max_new_tokens=3"])
    message = str(err.value)
    file_part, cli_part = message.split(" | ")
    assert file_part.startswith(f"{base}: unknown keys loop.learning_rate: did you mean loop.lr?")
    assert "loop.num_iterations: did you mean train.update_epochs?" in file_part
    assert "trainer.total_epochs: did you mean loop.epochs?" in file_part
    assert cli_part.startswith("command line: unknown keys --loop.beta: did you mean loop.kl_coef?")
    assert "--vllm_mode: did you mean sampler.backend?" in cli_part and "vllm_colocate" in cli_part
    assert "base.toml: unknown key --" not in message


def test_rlvr_train_names_its_own_arguments_and_the_files_keys_together(tmp_path):
    import rlvr

    base = tmp_path / "base.toml"
    base.write_text("[loop]\nnum_iterations = 2\n")
    rows = [{"prompt": f"{i}"} for i in range(120)]
    with pytest.raises(ConfigError) as err:
        rlvr.Run("tiny", rows, lambda completions, **kw: [0.0], config=base, beta=0.1, lerning_rate=1e-5,
                 **{"sampler.top_pp": 0.9})
    file_part, python_part = str(err.value).split(" | ")
    assert file_part == (f"{base}: unknown key loop.num_iterations: did you mean train.update_epochs? (TRL's "
                         "num_iterations; passes over each sampled batch, against one old-policy snapshot)")
    assert python_part.startswith("rlvr.train: unknown settings beta=: did you mean loop.kl_coef?")
    assert "lerning_rate=: did you mean loop.lr?" in python_part and "sampler.top_pp=: did you mean sampler.top_p?" \
        in python_part
