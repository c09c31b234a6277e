"""Environments from the hubs, run by the hub worker in their own Python (``make hubs``: ``.venv-hubs``)
through the recording proxy, each in a short training run on the tiny model:

- an OpenEnv environment written with ``openenv-core`` (tests/envs/openenv_envs/oe_tutor.py: one-digit
  sums, up to three tries) loaded as ``task.env = "openenv:<file>:AdditionTutor"``: its rows come from
  its resets, every reply is its action, its own reward scores the episode, retries are appended;
- a verifiers 0.4 ``v1`` taskset (tests/envs/vf1_envs/vf1_sums.py) played by verifiers' own
  ``SingleAgentEnv`` and chat harness (a program of its own per episode) whose model client reaches
  the episode's proxy URL through verifiers' interception server; the taskset's ``@reward`` scores it.

These check that each hub trains end to end (steps taken on its episodes, its rewards, the record),
and that the OpenEnv tutor's run is the plain agent's on the same rows, call for call; they do not
claim a held-out gain (see docs/agents.md for what was measured). Slow suite; skipped
without the hubs' Python unless RLVR_REQUIRE_HUBS=1."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("peft")

from rlvr.config.run import run_config_from_dict  # noqa: E402
from rlvr.envs.hubs import hubs_python, openenv_env, verifiers_v1_env  # noqa: E402
from rlvr.envs.tasks import arithmetic  # noqa: E402
from rlvr.errors import MissingExtraError  # noqa: E402
from rlvr.record.run_record import read_record  # noqa: E402
from rlvr.wiring.seams import make_loop  # noqa: E402

pytestmark = [pytest.mark.train, pytest.mark.slow]

ENVS = Path(__file__).resolve().parents[1] / "envs"
AGENT = Path(__file__).resolve().parents[2] / "examples" / "agent_addition.py"


@pytest.fixture(scope="module", autouse=True)
def hubs():
    try:
        hubs_python()
    except MissingExtraError as exc:
        if os.environ.get("RLVR_REQUIRE_HUBS"):
            pytest.fail(f"RLVR_REQUIRE_HUBS is set: {exc}")
        pytest.skip(str(exc))


def config(task: dict) -> dict:
    """A warm start to "right sometimes" (checked against the hub's reference answers), two GRPO steps."""
    return {
        "loop": {"max_steps": 2, "tasks_per_step": 4, "group_k": 4, "heldout_every": 2, "lr": 2e-3, "lora_rank": 8,
                 "corpus_min": 40, "heldout_frac": 0.2, "seed": 0},
        "model": {"hidden": 64, "layers": 2, "heads": 2, "threads": 1},
        "task": task,
        "sft": {"steps": 300, "target_accuracy": 0.3, "batch_size": 64, "lr": 3e-3, "check_every": 10,
                "check_rows": 50},
        "sampler": {"max_new_tokens": 5},
        "log": {"progress": "off"},
    }


def train(tmp_path: Path, task: dict) -> tuple[list[dict], list[dict]]:
    loop = make_loop(run_config_from_dict(config(task)), tmp_path / "run", log=lambda _m: None)
    loop.run()
    record = read_record(tmp_path / "run")
    assert [e.step for e in record.of_kind("step")] == [1, 2]
    sessions = [json.loads(x) for x in (tmp_path / "run" / "agents" / "sessions.jsonl").read_text().splitlines()]
    metrics = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert len([s for s in sessions if s["phase"] == "train"]) >= 2 * 4 * 4  # every training episode recorded
    return sessions, metrics


def test_an_openenv_environment_trains_through_the_proxy(tmp_path):
    sessions, metrics = train(tmp_path, {"env": f"openenv:{ENVS / 'openenv_envs' / 'oe_tutor.py'}:AdditionTutor",
                                         "env_args": {"max_turns": 3}, "n": 200})
    assert {s["row"].split("-")[0] for s in sessions} == {"seed"}  # rows are the environment's resets
    retried = [s for s in sessions if len(s["calls"]) > 1]
    assert retried and all(len(s["calls"]) <= 3 for s in sessions)
    retries = [c for s in retried for c in s["calls"][1:]]
    # A reply with a special token in it (decoded away) re-renders otherwise: a new segment, rightly.
    assert sum(c["kind"] == "append" for c in retries) >= 0.9 * len(retries)
    assert all("reward/turns" in row for row in metrics)  # the episode's metrics, as the worker reported them


def test_the_openenv_tutor_and_the_plain_agent_on_its_rows_are_one_run(tmp_path):
    """The hub's path adds nothing and loses nothing: examples/agent_addition.py, the same tutor as a
    plain ``openai`` agent, given the tutor's rows (the same ids, so the same sample seeds) makes the
    tutor's run: the same calls in every episode, the same rewards, losses and held-out scores."""
    tutor = {"env": f"openenv:{ENVS / 'openenv_envs' / 'oe_tutor.py'}:AdditionTutor", "env_args": {"max_turns": 3},
             "n": 200}
    env = openenv_env(tutor["env"].partition(":")[2])
    try:
        rows = env.make_rows(200)
    finally:
        env.source.close()
    data = tmp_path / "tutor_rows.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    hub_sessions, hub_metrics = train(tmp_path / "hub", tutor)
    agent_sessions, agent_metrics = train(tmp_path / "agent", {"data": str(data), "agent": f"{AGENT}:run"})

    def calls(sessions):
        return {(s["phase"], s["version"], s["row"], s["sample"]):
                [(c["kind"], c["prompt_tokens"], c["completion_tokens"], c["stop"]) for c in s["calls"]]
                for s in sessions}

    assert calls(agent_sessions) == calls(hub_sessions)
    for field in ("rollout/reward", "loss/total", "train/grad_norm"):
        assert [m[field] for m in agent_metrics] == [m[field] for m in hub_metrics], field
    heldout = [read_record(tmp_path / name / "run").heldout_scores for name in ("agent", "hub")]
    assert heldout[0] == heldout[1]


def test_a_verifiers_v1_taskset_trains_through_its_own_harness(tmp_path):
    sessions, metrics = train(tmp_path, {"env": "verifiers-v1:vf1_sums",
                                         "env_args": {"n": 120, "paths": [str(ENVS / "vf1_envs")]}, "n": 120})
    assert all(s["row"].startswith("vf1_sums-") and len(s["calls"]) == 1 for s in sessions)
    assert all("reward/turns" in row for row in metrics)


@pytest.mark.parametrize("make", [
    lambda: verifiers_v1_env("vf1_sums", paths=[str(ENVS / "vf1_envs")], n=200, digits=2),
    lambda: openenv_env(f"{ENVS / 'openenv_envs' / 'oe_tutor.py'}:AdditionTutor", digits=2),
], ids=["verifiers-v1", "openenv"])
def test_the_hub_sums_are_the_rows_of_rlvrs_addition_task(make):
    """docs/agents.md compares each hub run with its twin on rlvr's ``addition`` rows: the same rows."""
    env = make()
    try:
        rows = env.make_rows(200)
    finally:
        env.source.close()
    twin = arithmetic.make_rows(200, seed=0, digits=2)
    assert [(r["prompt"], r["answer"]) for r in rows] == [(r["prompt"], r["answer"]) for r in twin]
