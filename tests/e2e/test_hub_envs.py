"""Environments from the hubs, run by the hub worker in their own Python (``make hubs``: ``.venv-hubs``)
through the recording proxy: an OpenEnv environment written with ``openenv-core``
(tests/envs/openenv_envs/oe_tutor.py: one-digit sums, up to three tries) loaded with
``task.env = "openenv:<file>:AdditionTutor"``; its rows come from its resets, every reply is its
action, its own reward scores the episode, and the tiny model learns. Slow suite; skipped without the
hubs' Python unless RLVR_REQUIRE_HUBS=1."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("peft")

from rlvr.cli.settings import run_config_from_dict  # noqa: E402
from rlvr.cli.wiring import make_loop  # noqa: E402
from rlvr.envs.hubs import hubs_python  # noqa: E402
from rlvr.errors import MissingExtraError  # noqa: E402

pytestmark = [pytest.mark.train, pytest.mark.slow]

TUTOR = Path(__file__).resolve().parents[1] / "envs" / "openenv_envs" / "oe_tutor.py"


@pytest.fixture(scope="module", autouse=True)
def hubs():
    try:
        hubs_python()
    except MissingExtraError as exc:
        if os.environ.get("RLVR_REQUIRE_HUBS"):
            pytest.fail(f"RLVR_REQUIRE_HUBS is set: {exc}")
        pytest.skip(str(exc))


# The agent run's recipe (tests/e2e/test_agent_runs.py): a warm start to "right sometimes" (checked
# against the environment's reference answers), then GRPO through the proxy.
LEARNS = {
    "loop": {"max_steps": 8, "tasks_per_step": 12, "group_k": 4, "heldout_every": 4, "lr": 2e-3, "lora_rank": 8,
             "corpus_min": 60, "heldout_frac": 0.25, "seed": 0},
    "model": {"hidden": 64, "layers": 2, "heads": 2, "threads": 1},
    "task": {"env": f"openenv:{TUTOR}:AdditionTutor", "env_args": {"max_turns": 3}, "n": 400},
    "sft": {"steps": 1500, "target_accuracy": 0.3, "batch_size": 64, "lr": 3e-3, "check_every": 10,
            "check_rows": 50},
    "train": {"policy_loss": "grpo", "aggregation": "token-mean"},
    "sampler": {"max_new_tokens": 5},
    "log": {"progress": "off"},
}


def test_an_openenv_environment_learns_through_the_proxy(tmp_path):
    loop = make_loop(run_config_from_dict(LEARNS), tmp_path / "run", log=lambda _m: None)
    loop.run()
    summary = loop.summary()
    lines = [json.loads(x) for x in (tmp_path / "run" / "agents" / "sessions.jsonl").read_text().splitlines()]
    train = [line for line in lines if line["phase"] == "train"]
    print(f"held-out {summary['baseline_heldout_score']:.3f} -> {summary['selected_heldout_score']:.3f}")
    assert summary["heldout_gain"] >= 0.10, summary
    assert {line["row"].split("-")[0] for line in lines} == {"seed"}  # rows are the environment's resets
    assert all(1 <= len(line["calls"]) <= 3 for line in train) and any(len(line["calls"]) > 1 for line in train)
    record = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert all("reward/turns" in row for row in record)  # the episode's metrics, as the worker reported them


VF1 = Path(__file__).resolve().parents[1] / "envs" / "vf1_envs"


def test_a_verifiers_v1_taskset_learns_through_its_own_harness(tmp_path):
    # verifiers' own SingleAgentEnv and chat harness (a program of its own per episode) play each
    # episode, the harness's model client pointed at the episode's proxy URL through verifiers'
    # interception server; the taskset's @reward scores it. Smaller batches: every episode starts a program.
    cfg = {**LEARNS, "loop": {**LEARNS["loop"], "tasks_per_step": 8, "heldout_frac": 0.2},
           "task": {"env": "verifiers-v1:vf1_sums", "env_args": {"n": 120, "paths": [str(VF1)]}, "n": 120}}
    loop = make_loop(run_config_from_dict(cfg), tmp_path / "run", log=lambda _m: None)
    loop.run()
    summary = loop.summary()
    lines = [json.loads(x) for x in (tmp_path / "run" / "agents" / "sessions.jsonl").read_text().splitlines()]
    print(f"held-out {summary['baseline_heldout_score']:.3f} -> {summary['selected_heldout_score']:.3f}")
    assert summary["heldout_gain"] >= 0.10, summary
    assert lines and all(line["row"].startswith("vf1_sums-") and len(line["calls"]) == 1 for line in lines)
