"""The coding recipe (examples/coding_agent.toml: examples/coding_agent.py plays each episode through
the recording proxy, the coding environment applies its edit in the sandbox and the repository's
tests pay) runs end to end on the tiny model for a couple of steps. Slow suite.

Draw-independent: every step trains, every episode made exactly one call (the agent's) and was
recorded, every reward is all-pass (0 or 1) with its pass rate and refusals recorded beside it, and a
recorded reply scored again by a fresh environment gets the reward the run paid. That the recipe
learns is the learning bench's claim over seeds (``bench/learning.py --recipes coding``,
docs/environments.md), not this run's.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("openai")

from rlvr.config.run import load_run_config  # noqa: E402
from rlvr.envs.services.sandbox import bwrap_available  # noqa: E402
from rlvr.wiring.seams import make_loop  # noqa: E402

pytestmark = [pytest.mark.train, pytest.mark.slow,
              pytest.mark.skipif(not bwrap_available(), reason="bubblewrap does not work on this machine")]

ROOT = Path(__file__).resolve().parents[2]
SHORT = ["--loop.max_steps=2", "--loop.heldout_every=2", "--loop.tasks_per_step=6", "--loop.group_k=2",
         "--loop.corpus_min=40", "--loop.heldout_frac=0.2", "--task.n=100", "--sft.steps=20",
         "--sft.check_rows=10", "--sft.check_every=10", "--model.threads=1",
         f"--task.agent={ROOT / 'examples' / 'coding_agent.py'}:run", "--log.progress=off",
         "--log.log_samples_every=1"]


def test_the_coding_agent_recipe_trains_through_the_proxy_with_the_tests_as_reward(tmp_path):
    cfg = load_run_config(ROOT / "examples" / "coding_agent.toml", SHORT)
    loop = make_loop(cfg, tmp_path / "run", log=lambda _m: None)
    loop.run()
    run = tmp_path / "run"
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [1, 2]
    for m in metrics:
        assert m["train/nonfinite_skips"] == 0, m
        assert 0.0 <= m["reward/resolved"] <= 1.0 and 0.0 <= m["reward/pass_rate"] <= 1.0, m
        assert "reward/refused" in m, m
    assert sorted(loop.heldout_scores) == [0, 2]
    sessions = [json.loads(line) for line in (run / "agents" / "sessions.jsonl").read_text().splitlines()]
    train = [s for s in sessions if s["phase"] == "train"]
    assert len(train) >= 2 * 6 * 2  # steps x tasks x group_k: every episode recorded
    assert all(len(s["calls"]) == 1 and s["calls"][0]["kind"] == "new" for s in train)
    _recorded_replies_score_again_as_paid(run, cfg.task.n, cfg.task.seed, dict(cfg.task.params))


def _recorded_replies_score_again_as_paid(run: Path, n: int, seed: int, params: dict) -> None:
    """The samples the run kept, scored again by a fresh environment on their rows' repositories
    (found by prompt; a prompt two rows share is skipped, their hidden assertions may differ)."""
    from rlvr.envs.coding import CodingEnv, make_rows

    rows: dict[str, list[dict]] = {}
    for row in make_rows(n, seed=seed, **params):
        rows.setdefault(row["prompt"], []).append(row)
    samples = [json.loads(line) for path in sorted((run / "samples").glob("step_*.jsonl"))
               for line in path.read_text().splitlines()]
    assert samples, "the run kept no samples"
    env, checked = CodingEnv(), 0
    for sample in samples:
        found = rows.get(sample["prompt"], [])
        if len(found) != 1:
            continue
        info = found[0]["info"]
        score, _ = env.score_reply(sample["completion"], info["files"], info["tests"])
        assert score.value == sample["reward"], sample
        checked += 1
    assert checked >= len(samples) // 2, (checked, len(samples))
