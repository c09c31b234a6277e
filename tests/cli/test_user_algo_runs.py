"""User code named by ``[algo] import_path`` in a real (tiny) run: an Algorithm subclass from a
file trains, and what cannot be loaded is refused before anything is written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("torch")

from rlvr.config.run import run_config_from_dict  # noqa: E402
from rlvr.errors import ConfigError  # noqa: E402
from rlvr.wiring.seams import make_loop  # noqa: E402

pytestmark = pytest.mark.train
EXAMPLE = str(Path(__file__).resolve().parents[2] / "examples" / "my_algo.py")


def config(algo: dict) -> dict:
    return {"loop": {"max_steps": 2, "tasks_per_step": 4, "group_k": 2, "heldout_every": 2, "corpus_min": 20,
                     "heldout_frac": 0.2, "lr": 1e-3},
            "model": {"hidden": 16, "layers": 1, "heads": 2, "threads": 1},
            "task": {"n": 60}, "sft": {"steps": 0}, "sampler": {"max_new_tokens": 3}, "algo": algo}


def test_an_algorithm_subclass_named_in_the_config_trains(tmp_path):
    cfg = run_config_from_dict(config({"type": "custom", "import_path": f"{EXAMPLE}:Contrast",
                                       "kwargs": {"scale": 0.5}}))
    make_loop(cfg, tmp_path / "run", log=lambda _m: None).run()
    run = json.loads((tmp_path / "run" / "run.json").read_text())
    assert run["algorithms"][""] == {"type": "contrast", "components": ["rl"], "import_path": f"{EXAMPLE}:Contrast",
                                     "scale": 0.5}
    steps = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    trained = [m for m in steps if "loss/rl" in m]
    assert len(trained) == 2 and all(m["loss/rl"] != 0.0 for m in trained)  # ±0.5 credit reached the loss


@pytest.mark.parametrize(("algo", "message"), [
    ({"type": "custom", "import_path": f"{EXAMPLE}:nothing_here"}, r"algo.import_path"),
    ({"type": "custom", "import_path": f"{EXAMPLE}:Rollout"}, r"not a credit function or an rlvr.algos.Algorithm"),
    ({"type": "echo", "import_path": f"{EXAMPLE}:Contrast"}, r"algo.import_path=.*names .*Contrast.*not a function"),
])
def test_what_import_path_names_is_checked_before_anything_is_written(tmp_path, algo, message):
    with pytest.raises(ConfigError, match=message):
        make_loop(run_config_from_dict(config(algo)), tmp_path / "run", log=lambda _m: None)
    assert not (tmp_path / "run").exists()


def test_echo_kwargs_without_a_filter_are_refused():
    with pytest.raises(ConfigError, match=r"algo.kwargs are the keyword arguments of what algo.import_path names"):
        run_config_from_dict(config({"type": "echo", "kwargs": {"n": 2}}))


def test_echo_s_filter_is_loaded_from_the_file_with_its_kwargs():
    from rlvr.config.run import AlgoSection
    from rlvr.types import Rollout, Task
    from rlvr.wiring.user_algos import echo_algorithm

    algo = echo_algorithm(AlgoSection(type="echo", import_path=f"{EXAMPLE}:first_env_tokens", kwargs={"n": 1}),
                          "grpo", "algo")
    task = Task("r", ({"role": "user", "content": "q"},), "a", "h")
    # a tool answer of three tokens: with n = 1 only its first one stays in ce (0.1, the default table)
    turn = Rollout("r", (1,), (5, 6, 7, 8, 9), (0.0,) * 5, "x", task.messages, version=0, loss_mask=(1, 0, 0, 0, 1),
                   reward=1.0, token_roles=("", "tool", "tool", "tool", ""))
    other = Rollout("r", (1,), (5,), (0.0,), "x", task.messages, version=0, reward=0.0)
    assert algo.assign(task, [[turn], [other]]).rollouts[0].ce_weights == (0.0, 0.1, 0.0, 0.0, 0.0)
