"""The LLM-judge example: a short run whose reward is a real `rlvr serve` judge, called from reward
worker processes. It checks the plumbing (every sample judged, in the workers, each call bounded),
not the judge's wisdom: the judge is a random tiny model."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("peft")

from rlvr.backends.model.tiny import build_tiny_model  # noqa: E402
from rlvr.backends.serve.process import ServerProcess  # noqa: E402
from rlvr.config.run import run_config_from_dict  # noqa: E402
from rlvr.envs.workers import RewardWorkers  # noqa: E402
from rlvr.record.run_record import read_record  # noqa: E402
from rlvr.wiring.seams import make_loop  # noqa: E402

pytestmark = [pytest.mark.train, pytest.mark.slow]

JUDGE_ENV = Path(__file__).resolve().parents[2] / "examples" / "judge_env.py"


def test_a_judge_served_by_rlvr_serve_scores_every_sample_from_reward_workers(tmp_path):
    judge = build_tiny_model(tmp_path / "judge", hidden=32, layers=1, heads=2, seed=1)
    with ServerProcess(judge, served_model_name="judge", threads=1, startup_timeout_s=120) as server:
        cfg = run_config_from_dict({
            "loop": {"max_steps": 2, "tasks_per_step": 4, "group_k": 2, "heldout_every": 2, "corpus_min": 20,
                     "heldout_frac": 0.2, "lora_rank": 0, "lr": 1e-4, "temp": 1.0, "reward_timeout_s": 30.0},
            "model": {"hidden": 32, "layers": 1, "heads": 2, "threads": 1},
            "task": {"name": "addition", "n": 60, "env": str(JUDGE_ENV), "reward_workers": 2,
                     "env_args": {"judge_url": f"{server.url}/v1", "judge_model": "judge", "timeout_s": 10.0}},
            "sampler": {"max_new_tokens": 6},
        })
        pids: set[int] = set()  # the workers' processes, seen at each step's progress report
        loop = make_loop(cfg, tmp_path / "run", log=lambda _m: None,
                         progress_cb=lambda _progress: pids.update(workers.pids()))
        workers = loop.rewards[None]
        assert isinstance(workers, RewardWorkers)
        try:
            loop.run()
            assert workers.pids() == []  # the run stopped its workers as it ended
        finally:
            workers.close()
    record = read_record(tmp_path / "run")
    assert record.finished.data["stop_cause"] == "max_steps"
    assert len(pids) == 2 and os.getpid() not in pids
    assert workers.timeouts == 0 and workers.replaced == 0 and workers.timeout_s == 30.0
    lines = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    steps = [m for m in lines if "rollout/reward" in m]
    assert len(steps) == 2
    for m in steps:  # every trained sample judged: no drops, the judge's log-probs beside each reward
        assert m["rollout/sample_drops"] == 0 and m["rollout/groups"] == 4
        assert "reward/judge_yes" in m and "reward/judge_no" in m and 0.0 < m["rollout/reward"] < 1.0
    assert workers.calls >= 2 * 4 * 2
