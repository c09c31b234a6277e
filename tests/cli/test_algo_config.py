"""``[algo]`` and ``[envs.NAME]`` at load: every combination that cannot learn is refused naming the field."""

from __future__ import annotations

import pytest

from rlvr.config.run import run_config_from_dict
from rlvr.errors import ConfigError

TEACHER = {"name": "teacher", "base_url": "http://127.0.0.1:9/v1"}


@pytest.mark.parametrize(("algo", "message"), [
    ({"type": "opd"}, r"type = 'opd' distils from a teacher: set algo.model"),
    ({"type": "opd", "model": "policy"}, r"KL 0"),
    ({"type": "sft"}, r"type = 'sft' learns from a frozen model's samples: set algo.sampling.source"),
    ({"type": "sft", "sampling": {"source": "policy"}}, r"algo.sampling.source"),
    ({"type": "grpo", "sampling": {"source": TEACHER}}, r"algo.sampling.source: type = 'grpo' samples from the policy"),
    ({"type": "custom"}, r"needs algo.import_path"),
    ({"type": "grpo", "roles": {"tool": 1.0}}, r"algo.roles is not used by type = 'grpo' \(only by echo\)"),
    ({"type": "grpo", "model": TEACHER}, r"algo.model is not used by type = 'grpo'"),
    ({"type": "opd", "model": {"name": "t"}}, r"base_url"),
    ({"type": "nope"}, r"AlgoSection.type"),
])
def test_an_algorithm_that_cannot_learn_is_refused_at_load(algo, message):
    with pytest.raises(ConfigError, match=message):
        run_config_from_dict({"algo": algo})


def test_each_environment_has_its_algorithm_and_the_run_default_fills_in():
    cfg = run_config_from_dict({"algo": {"type": "max_rl"}, "envs": {
        "a": {"name": "addition"}, "b": {"name": "sorting", "algo": {"type": "opd", "model": TEACHER}}}})
    algos = cfg.algorithms()
    assert algos["a"].type == "max_rl" and algos["b"].type == "opd"
    again = run_config_from_dict(cfg.model_dump(mode="json"))  # a saved config.json resumes
    assert again.algorithms() == algos


def test_task_and_envs_are_not_both_given():
    with pytest.raises(ConfigError, match=r"\[task\] and \[envs\.\*\] both given"):
        run_config_from_dict({"task": {"name": "sorting"}, "envs": {"a": {"name": "addition"}}})
    with pytest.raises(ConfigError, match=r"envs.*without '/'"):
        run_config_from_dict({"envs": {"a/b": {"name": "addition"}}})


def test_a_custom_credit_that_does_not_import_fails_before_anything_is_written(tmp_path):
    from rlvr.config.run import load_run_config
    from rlvr.wiring.seams import make_loop

    cfg = load_run_config(None, ["--algo.type=custom", "--algo.import_path=no_such_module_xyz:fn",
                                 "--loop.max_steps=1", "--sft.steps=0", "--task.n=120"])
    with pytest.raises(ConfigError, match=r"algo.import_path"):
        make_loop(cfg, tmp_path / "run", log=lambda _: None)
    assert not (tmp_path / "run").exists()


def test_a_teacher_that_is_not_there_fails_before_anything_is_written(tmp_path):
    from rlvr.config.run import load_run_config
    from rlvr.wiring.seams import make_loop

    cfg = load_run_config(None, ["--algo.type=opd", "--loop.max_steps=1", "--sft.steps=0", "--task.n=120",
                                 '--algo.model={name = "t", base_url = "http://127.0.0.1:9/v1", timeout_s = 2.0}'])
    with pytest.raises(ConfigError, match=r"algo.model"):
        make_loop(cfg, tmp_path / "run", log=lambda _: None)
    assert not (tmp_path / "run").exists()
