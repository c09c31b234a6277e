"""GRPOConfig: every field rejects a bad value with the field named; closed and strict."""

from __future__ import annotations

import pytest

from rlvr import ConfigError, GRPOConfig, RLLoop, RLLoopError, RLVRError
from rlvr.testing import exact_match

# One bad value per field. The completeness test below makes a new field fail until it has one.
BAD_VALUES = {
    "base": "",
    "lora_rank": -1,
    "advantage": "ppo",
    "group_k": 0,
    "tasks_per_step": 0,
    "temp": 0.0,
    "heldout_every": 0,
    "vllm_pin": "not a version!",
    "max_steps": 0,
    "epochs": 0,
    "corpus_min": 0,
    "heldout_frac": 1.0,
    "kl_coef": -0.1,
    "lr": 0.0,
    "seed": -1,
    "heldout_patience": 0,
    "checkpoint_every": 0,
    "keep_last": 0,
    "split_salt": "",
    "max_head_offpolicy_versions": -1,
    "synchronous_training": "yes",
    "max_rows_in_flight": 0,
    "min_group_size": 0,
    "filter_zero_variance": 1,
    "max_oversample": 0.5,
    "on_sample_error": "ignore",
    "rollout_timeout_s": 0.0,
    "reward_timeout_s": -1.0,
    "heldout_max_rows": 0,
    "train_eval": "no",
    "warn_flat_steps": 0,
}


def test_every_field_has_a_bad_value_under_test():
    assert set(BAD_VALUES) == set(GRPOConfig.model_fields)


@pytest.mark.parametrize("name", sorted(GRPOConfig.model_fields))
def test_bad_value_is_refused_naming_the_field(name):
    with pytest.raises(ConfigError) as info:
        GRPOConfig(**{name: BAD_VALUES[name]})
    assert f"GRPOConfig.{name}:" in str(info.value)


def test_defaults_are_valid_and_checkpoint_period_falls_back_to_heldout_every():
    cfg = GRPOConfig()
    assert cfg.checkpoint_period == cfg.heldout_every
    assert GRPOConfig(heldout_every=5, checkpoint_every=2).checkpoint_period == 2


def test_unknown_key_is_refused_with_the_key_named():
    with pytest.raises(ConfigError, match=r"GRPOConfig\.group_size: unknown key"):
        GRPOConfig(group_size=4)


def test_a_trl_name_is_answered_with_rlvrs_key():
    with pytest.raises(ConfigError, match=r"GRPOConfig\.learning_rate: unknown key; did you mean loop\.lr\? "
                                          r"\(TRL's learning_rate\)"):
        GRPOConfig(learning_rate=1e-5)


@pytest.mark.parametrize("name, value", [("group_k", "4"), ("group_k", 4.0), ("temp", "0.8"),
                                         ("seed", True), ("base", 3)])
def test_wrong_type_is_refused_not_coerced(name, value):
    with pytest.raises(ConfigError, match=rf"GRPOConfig\.{name}:"):
        GRPOConfig(**{name: value})


@pytest.mark.parametrize("advantage", ["grpo", "dr_grpo", "rloo"])
def test_group_relative_advantage_needs_two_completions(advantage):
    # The rule involves the algorithm, so the loop checks it when it is built, before anything runs.
    from rlvr import RLLoop
    from rlvr.testing import FakeSampler, FakeTrainer

    cfg = GRPOConfig(advantage=advantage, group_k=1)
    with pytest.raises(ConfigError, match=r"loop\.group_k = 1:.*group-relative.*group_k >= 2"):
        RLLoop.from_reward(cfg, lambda m, a: 0.0, [], sampler=FakeSampler(), trainer=FakeTrainer(),
                           heldout_eval=lambda s, t: 0.0)
    assert GRPOConfig(advantage=advantage, group_k=2).group_k == 2


@pytest.mark.parametrize("advantage", ["reinforce_pp", "reinforce_pp_baseline", "global_baseline"])
def test_batch_estimators_take_one_completion_per_row(advantage):
    from rlvr import RLLoop
    from rlvr.testing import FakeSampler, FakeTrainer

    RLLoop.from_reward(GRPOConfig(advantage=advantage, group_k=1), lambda m, a: 0.0, [], sampler=FakeSampler(),
                       trainer=FakeTrainer(), heldout_eval=lambda s, t: 0.0)


def test_config_error_is_a_value_error_in_the_rlvr_tree_not_a_loop_error():
    with pytest.raises(ValueError):
        GRPOConfig(max_steps=0)
    with pytest.raises(RLVRError) as caught:
        GRPOConfig(max_steps=0)
    assert isinstance(caught.value, ConfigError) and not isinstance(caught.value, RLLoopError)


def test_config_is_frozen():
    cfg = GRPOConfig()
    with pytest.raises(Exception, match="frozen"):
        cfg.max_steps = 3  # type: ignore[misc]
    assert cfg.max_steps == 34


def test_digest_is_stable_and_changes_with_any_value():
    assert GRPOConfig(seed=1).digest() == GRPOConfig(seed=1).digest()
    assert GRPOConfig(seed=1).digest() != GRPOConfig(seed=2).digest()
    assert len(GRPOConfig().digest()) == 64


def test_loop_refuses_a_config_that_is_not_a_grpo_config(rows):
    with pytest.raises(RLLoopError, match="config must be a GRPOConfig, got dict"):
        RLLoop.from_reward({"max_steps": 3}, exact_match, rows)  # type: ignore[arg-type]


def test_synchronous_training_refuses_an_offpolicy_window():
    with pytest.raises(ConfigError, match="max_head_offpolicy_versions must be 0"):
        GRPOConfig(synchronous_training=True, max_head_offpolicy_versions=1)


def test_min_group_size_cannot_exceed_the_group():
    with pytest.raises(ConfigError, match="min_group_size=5 exceeds group_k=4"):
        GRPOConfig(group_k=4, min_group_size=5)
    assert GRPOConfig(group_k=4).group_minimum == 2 and GRPOConfig(group_k=4, min_group_size=4).group_minimum == 4
