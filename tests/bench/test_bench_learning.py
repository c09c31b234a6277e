"""The learning bench's recipes are runs the config loader accepts: each config with its overrides, the
seed and (for distillation) the teacher's address at the key the recipe names. A recipe whose key is
wrong would otherwise fail every seed only when the bench runs, minutes in."""

from __future__ import annotations

import pytest

from rlvr.config.run import load_run_config
from support.bench_rig import bench_module

learning = bench_module("learning")


@pytest.mark.parametrize("name", sorted(learning.RECIPES))
def test_every_recipe_loads_with_its_seed_and_teacher(name):
    recipe = learning.RECIPES[name]
    overrides = [*recipe.overrides, "--loop.seed=3"]
    if recipe.teacher:
        overrides.append(f"--{recipe.teacher}=http://127.0.0.1:8011/v1")
    cfg = load_run_config(recipe.config, [o.removeprefix("--") for o in overrides])
    assert cfg.loop.seed == 3
    if recipe.teacher:
        node = cfg
        for part in recipe.teacher.split("."):
            node = node[part] if isinstance(node, dict) else getattr(node, part)
        assert node == "http://127.0.0.1:8011/v1"


def test_the_comparison_benches_build_their_base_and_run_rlvr_as_rlvr_train_does(tmp_path):
    """bench/compare_runs (trl_compare's and gpu_compare's phases): run_base warm-starts the demo's tiny
    base in the rlvr run's folder, and run_rlvr runs on it with the shared held-out scorer."""
    pytest.importorskip("torch")
    compare_runs = bench_module("compare_runs")
    example = str(learning.EX / "addition.toml")
    small = ["sft.steps=2", "model.hidden=32", "model.layers=1", "loop.max_steps=1", "loop.heldout_every=1",
             "loop.tasks_per_step=2", "loop.group_k=2"]
    built = compare_runs.run_base(example, small, tmp_path)
    assert built["base"] == str(tmp_path / "rlvr_run" / "base")
    assert (tmp_path / "rlvr_run" / "base" / "rlvr_base.json").is_file()
    ran = compare_runs.run_rlvr(example, small, tmp_path)
    assert ran and (tmp_path / "rlvr_run" / "run.json").is_file()


def test_a_recipe_that_loads_the_machine_by_itself_runs_alone_after_the_others():
    jobs = [("verifiers-v1", 0), ("demo", 0), ("verifiers-v1", 1), ("openenv", 0)]
    assert learning.schedule(jobs, 3) == [([("demo", 0), ("openenv", 0)], 3), ([("verifiers-v1", 0)], 1),
                                          ([("verifiers-v1", 1)], 1)]
    assert learning.schedule([("demo", 0), ("demo", 1)], 2) == [([("demo", 0), ("demo", 1)], 2)]
