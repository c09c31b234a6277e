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
    (["--loop.per_device_train_batch_size=8"], "did you mean loop.tasks_per_step?"),
    (["--loop.max_completion_length=256"], "did you mean sampler.max_new_tokens?"),
    (["--actor_rollout_ref.actor.optim.lr=1e-6"], "did you mean loop.lr? (verl's actor_rollout_ref.actor.optim.lr)"),
    (["--actor_rollout_ref.rollout.n=8"], "did you mean loop.group_k?"),
    (["--loop.kl_loss_coef=0.001"], "did you mean loop.kl_coef? (verl's kl_loss_coef)"),
    (["--loop.max_new_tokens=64"], "loop.max_new_tokens: did you mean sampler.max_new_tokens?"),
    (["--loop.group_kk=4"], "did you mean loop.group_k?"),
    (["--learning_rate=1e-5"], "expected --section.key=value; did you mean loop.lr?"),
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
    assert err == ["rlvr: error: config: unknown key loop.learning_rate: did you mean loop.lr? (TRL's learning_rate)"]
