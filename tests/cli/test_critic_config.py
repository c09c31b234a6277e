"""``[critic]`` and ``loop.advantage = 'gae'`` at load: a critic needs a reader, critic keys need a critic,
verl's and TRL's critic names point at rlvr's."""

from __future__ import annotations

import pytest

from rlvr.config.run import load_run_config, run_config_from_dict
from rlvr.errors import ConfigError


def test_gae_with_grpo_has_a_critic_and_a_saved_config_resumes():
    cfg = run_config_from_dict({"loop": {"advantage": "gae"}, "critic": {"gamma": 0.99, "lam": 0.95,
                                                                         "warmup_steps": 3}})
    assert cfg.uses_critic() and cfg.critic.warmup_steps == 3
    assert run_config_from_dict(cfg.model_dump(mode="json")) == cfg
    plain = run_config_from_dict({})
    assert not plain.uses_critic()
    assert run_config_from_dict(plain.model_dump(mode="json")) == plain  # every critic key spelled out, defaults


def test_critic_keys_without_a_critic_are_refused():
    with pytest.raises(ConfigError, match=r"critic.warmup_steps configures the critic of loop.advantage = 'gae'"):
        run_config_from_dict({"critic": {"warmup_steps": 2}})


def test_gae_with_an_algorithm_that_does_not_read_it_is_refused():
    with pytest.raises(ConfigError, match=r"loop.advantage = 'gae' is read by algo.type grpo and echo.*'max_rl'"):
        run_config_from_dict({"loop": {"advantage": "gae"}, "algo": {"type": "max_rl"}})


@pytest.mark.parametrize(("key", "value", "message"), [
    ("gamma", 1.5, "CriticSection.gamma"), ("lam", -0.1, "CriticSection.lam"), ("value_clip", 0.0, "value_clip"),
    ("vf_coef", 2.0, "vf_coef"), ("warmup_steps", -1, "warmup_steps")])
def test_critic_values_out_of_range_are_refused(key, value, message):
    with pytest.raises(ConfigError, match=message):
        run_config_from_dict({"loop": {"advantage": "gae"}, "critic": {key: value}})


@pytest.mark.parametrize(("foreign", "ours"), [
    ("critic.cliprange_value", "critic.value_clip"), ("trainer.critic_warmup", "critic.warmup_steps"),
    ("algorithm.gamma", "critic.gamma"), ("algorithm.lam", "critic.lam"), ("critic.optim.lr", "critic.lr")])
def test_verl_critic_names_point_at_ours(foreign, ours):
    with pytest.raises(ConfigError, match=f"did you mean {ours}"):
        load_run_config(None, [f"--{foreign}=1"])
