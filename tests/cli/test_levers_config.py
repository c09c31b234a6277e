"""The training levers at config load: each is read into what the run builds, and refused with a
message naming what it needs where it does not apply (a loss knob the loss has not, two warmups,
shaping beyond the budget, W&B keys without the W&B sink...)."""

from __future__ import annotations

import pytest

from rlvr.config.run import load_run_config, run_config_from_dict
from rlvr.errors import ConfigError


def refused(sections: dict, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        run_config_from_dict(sections)


@pytest.mark.parametrize(("knob", "value", "loss", "users"), [
    ("clip_eps_high", 0.28, "grpo", r"\['dapo', 'gspo', 'ppo'\]"),
    ("clip_eps_low", 0.2, "cispo", r"\['dapo', 'gspo', 'ppo'\]"),
    ("dual_clip", 3.0, "gspo", r"\['dapo', 'ppo'\]"),
    ("cispo_cap", 4.0, "ppo", r"\['cispo'\]"),
    ("dro_beta", 0.1, "grpo", r"\['dro'\]"),
])
def test_a_loss_knob_the_loss_does_not_read_is_refused_naming_the_losses_that_do(knob, value, loss, users):
    refused({"train": {"policy_loss": loss, knob: value}},
            rf"train.{knob} is not used by policy_loss = '{loss}' \(only by {users}\)")


def test_a_loss_knob_with_a_custom_loss_points_at_its_kwargs():
    refused({"train": {"policy_loss": "my_losses:clipped", "clip_eps_high": 0.3}},
            "a custom policy_loss takes its settings from train.policy_loss_kwargs")


def test_loss_knobs_are_read_into_the_loss(tmp_path):
    pytest.importorskip("torch")
    from rlvr.wiring.levers import loss_config

    path = tmp_path / "run.toml"
    path.write_text('[train]\npolicy_loss = "dapo"\nclip_eps_low = 0.1\nclip_eps_high = 0.3\ndual_clip = 4.0\n'
                    'mis_high = 2.0\nmis_low = 0.5\nis_level = "sequence"\n')
    loss = loss_config(load_run_config(path))
    assert (loss.clip_eps_low, loss.clip_eps_high, loss.dual_clip) == (0.1, 0.3, 4.0)
    assert (loss.mis_low, loss.mis_high, loss.is_level, loss.tis_cap) == (0.5, 2.0, "sequence", None)
    cispo = loss_config(run_config_from_dict({"train": {"policy_loss": "cispo", "cispo_cap": 4.0}}))
    assert cispo.policy_loss_params()["cispo_cap"] == 4.0


@pytest.mark.parametrize(("train", "match"), [
    ({"tis_cap": 2.0, "mis_high": 2.0}, "two corrections of the same weight; set one of them"),
    ({"mis_low": 0.5}, "train.mis_low is the lower bound of masked IS: set train.mis_high too"),
    ({"mis_low": 2.0, "mis_high": 2.0}, "train.mis_low=2.0 must be below train.mis_high=2.0"),
    ({"is_level": "sequence"}, "is the level of an IS correction: set train.tis_cap or train.mis_high"),
    ({"warmup_steps": 3, "warmup_ratio": 0.1}, "both set the warmup; set one of them"),
    ({"lr_schedule": "cosine", "decay_ratio": 0.2}, "train.decay_ratio is the decay phase of lr_schedule = 'wsd'"),
    ({"min_lr_ratio": 0.1}, "lr_schedule = 'constant' never decays"),
    ({"warmup_ratio": 1.0}, "warmup_ratio"),
    ({"overlong_penalty": 0.5}, "train.overlong_penalty scales the overlong shaping: set train.overlong_buffer"),
    ({"update_epochs": 0}, "update_epochs"),
])
def test_levers_that_do_not_fit_are_refused_at_load(train, match):
    refused({"train": train}, match)


def test_overlong_shaping_is_refused_beyond_the_budget_or_across_turns():
    refused({"train": {"overlong_buffer": 20}, "sampler": {"max_new_tokens": 16}},
            "train.overlong_buffer=20 is longer than the whole budget, sampler.max_new_tokens=16")
    refused({"train": {"overlong_buffer": 4}, "task": {"env": "retry", "max_turns": 3, "name": None}},
            "task.max_turns > 1 plays several turns per sample")
    cfg = run_config_from_dict({"train": {"overlong_buffer": 4, "mask_truncated_completions": True,
                                          "length_penalty": 0.1}, "sampler": {"max_new_tokens": 16}})
    assert cfg.train.overlong_buffer == 4


def test_shaping_is_built_at_the_sampler_s_budget():
    pytest.importorskip("torch")
    from rlvr.wiring.levers import shaping

    built = shaping(run_config_from_dict({"train": {"overlong_buffer": 4, "overlong_penalty": 0.5,
                                                    "mask_truncated_completions": True},
                                          "sampler": {"max_new_tokens": 12}}))
    assert (built.max_tokens, built.overlong_buffer, built.overlong_penalty, built.mask_truncated) == (12, 4, 0.5, True)


def test_a_warmup_longer_than_the_run_is_refused_naming_the_keys():
    pytest.importorskip("torch")
    from rlvr.wiring.levers import lr_schedule

    cfg = run_config_from_dict({"loop": {"max_steps": 10, "epochs": 1, "tasks_per_step": 10},
                                "train": {"lr_schedule": "cosine", "warmup_steps": 5}})
    assert lr_schedule(cfg, 1000).total_steps == 10  # max_steps ends first
    with pytest.raises(ConfigError, match=r"5 warmup steps leave no room to decay in 4 steps.*loop.epochs"):
        lr_schedule(cfg, 40)  # one pass over 40 rows at 10 a step: 4 steps


def test_chat_template_kwargs_may_not_set_what_rlvr_renders_with():
    refused({"task": {"chat_template_kwargs": {"tools": "x", "enable_thinking": False}}},
            r"task.chat_template_kwargs may not set \['tools'\]")
    env = {"name": "addition", "chat_template_kwargs": {"enable_thinking": False}}
    refused({"envs": {"a": env, "b": {**env, "chat_template_kwargs": {}}}},
            "envs.*.chat_template_kwargs differ")
    cfg = run_config_from_dict({"envs": {"a": env, "b": {**env, "system_prompt": "Be brief."}}})
    assert cfg.template_kwargs() == {"enable_thinking": False}


def test_wandb_keys_need_the_wandb_sink():
    refused({"log": {"wandb_mode": "online"}}, "log.wandb_mode is for the W&B sink: add 'wandb' to log.sinks")
    refused({"log": {"wandb_entity": "team"}}, "log.wandb_entity is for the W&B sink")
    refused({"log": {"sinks": ["wandb"], "wandb_mode": "live"}}, "wandb_mode")
    cfg = run_config_from_dict({"log": {"sinks": ["wandb"], "wandb_mode": "online", "wandb_entity": "team"}})
    assert (cfg.log.wandb_mode, cfg.log.wandb_entity) == ("online", "team")


def test_epochs_must_be_at_least_one():
    refused({"loop": {"epochs": 0}}, "epochs")
    assert run_config_from_dict({"loop": {"epochs": 2}}).loop.epochs == 2
