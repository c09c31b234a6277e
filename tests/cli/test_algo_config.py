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


@pytest.mark.parametrize(("algo", "slot"), [("opd", "model"), ("opsd", "model"), ("sft", "source")])
def test_teacher_is_another_name_for_the_slot_the_algorithm_declares(tmp_path, algo, slot):
    from rlvr.config.algo_section import Endpoint
    from rlvr.config.run import load_run_config

    cfg = run_config_from_dict({"algo": {"type": algo, "teacher": TEACHER}})
    folded = cfg.algo.model if slot == "model" else cfg.algo.sampling.source
    assert folded == Endpoint(**TEACHER)
    written = cfg.model_dump(mode="json")
    assert "teacher" not in written["algo"]  # the resolved config holds the slot alone, and reloads equal
    assert run_config_from_dict(written) == cfg
    # The same alias as a TOML table, on the command line and inside an environment's algo.
    path = tmp_path / "run.toml"
    path.write_text(f'[algo]\ntype = "{algo}"\n\n[algo.teacher]\nname = "teacher"\n'
                    f'base_url = "{TEACHER["base_url"]}"\n')
    assert load_run_config(path) == cfg
    override = f'--algo.teacher={{name = "teacher", base_url = "{TEACHER["base_url"]}"}}'
    assert load_run_config(None, [f"--algo.type={algo}", override]).algo == cfg.algo
    env = run_config_from_dict({"envs": {"a": {"name": "addition", "algo": {"type": algo, "teacher": TEACHER}}}})
    assert env.algorithms()["a"] == cfg.algo


def test_teacher_beside_its_slot_must_agree_and_a_type_without_one_refuses_it():
    same = {**TEACHER, "timeout_s": 60.0}  # the default written out: the same model
    agreed = run_config_from_dict({"algo": {"type": "opd", "teacher": TEACHER, "model": same}})
    assert agreed.algo.model.name == "teacher"
    with pytest.raises(ConfigError, match=r"algo.teacher and algo.model name different models \('teacher' at "
                                          r"http://127.0.0.1:9/v1 and 'other' at http://127.0.0.1:9/v1\)"):
        run_config_from_dict({"algo": {"type": "opd", "teacher": TEACHER, "model": {**TEACHER, "name": "other"}}})
    with pytest.raises(ConfigError, match=r"algo.teacher and algo.sampling.source name different models"):
        run_config_from_dict({"algo": {"type": "sft", "teacher": TEACHER, "sampling": {"source": "policy"}}})
    with pytest.raises(ConfigError, match=r"algo.teacher: type = 'grpo' has no teacher \(only opd \(algo.model\)"):
        run_config_from_dict({"algo": {"teacher": TEACHER}})
    with pytest.raises(ConfigError, match=r"KL 0"):  # folded first, then judged as algo.model would be
        run_config_from_dict({"algo": {"type": "opd", "teacher": "policy"}})
    opsd = run_config_from_dict({"algo": {"type": "opsd", "teacher": "policy"}})
    assert opsd.algo.model == "policy"
