"""PPO with a critic in real runs of the CLI on the tiny model.

- The CPU demo (``examples/addition.toml``) with ``loop.advantage = 'gae'``, the ``ppo`` loss and the
  default critic trains its critic: the critic's metrics in every step, and its predictions, from a
  zero start, reach the level of the returns they regress. Its held-out gain over 60 steps is a draw
  (+0.088 in one run on the split by prompt twins, where an earlier threshold of 0.15 failed; it
  passed on the split before): how much the recipe learns is the bench's ``critic-e2e`` recipe, over
  seeds (docs/benchmarks.md), not a threshold here.
- A short run with a critic warm-up, SIGKILLed and resumed, records the same metrics (the critic's
  included) as an uninterrupted one: the critic's state travels with the checkpoint.

Marked slow: they train for real (the demo is a few minutes on two busy cores).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("peft")

from rlvr.record.run_record import read_record, strip_timing  # noqa: E402

pytestmark = [pytest.mark.train, pytest.mark.slow]

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "addition.toml"
PPO = ["--loop.advantage=gae", "--train.policy_loss=ppo", "--loop.train_eval=false"]
DEMO_STEPS = 60
CRITIC_METRICS = ("loss/value", "critic/value_clip_frac", "critic/explained_variance", "critic/vpred_mean")

SHORT = """
[loop]
max_steps = 4
tasks_per_step = 8
group_k = 2
temp = 1.0
heldout_every = 2
checkpoint_every = 1
lr = 5e-3
lora_rank = 4
seed = 3
corpus_min = 100
advantage = "gae"

[model]
hidden = 32
layers = 2
heads = 2
threads = 1

[task]
name = "addition"
n = 150

[sft]
steps = 20
batch_size = 32
lr = 3e-3

[train]
policy_loss = "ppo"
ppo_n_minibatches = 2

[critic]
warmup_steps = 2
lam = 0.95

[sampler]
max_new_tokens = 5
"""


def rlvr(*args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "rlvr.cli", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


def finish(proc: subprocess.Popen, timeout: float = 1500) -> str:
    out, _ = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, out[-3000:]
    return out


def steps_done(run: Path) -> int:
    path = run / "events.jsonl"
    if not path.exists():
        return 0
    return sum(1 for line in path.read_text().splitlines() if line.endswith("}") and '"kind": "step"' in line)


def test_the_demo_trains_its_critic_with_ppo_gae(tmp_path):
    out = tmp_path / "demo"
    finish(rlvr("train", str(EXAMPLE), "--out", str(out), f"--loop.max_steps={DEMO_STEPS}", "--model.threads=1", *PPO))
    record = read_record(out)
    summary = record.finished.data["summary"]
    print(f"held-out {summary['baseline_heldout_score']:.3f} -> {summary['selected_heldout_score']:.3f} "
          f"(step {summary['selected_step']}), gain {summary['heldout_gain']:+.3f}; "
          f"{[round(m['critic/values_mean'], 3) for m in record.metrics[::10]]} mean values")
    assert all(all(k in m for k in CRITIC_METRICS) for m in record.metrics)
    assert record.metrics[-1]["critic/values_mean"] > 0  # the head learned something from a zero start
    # From a zero start the mean prediction trails the mean return by the whole return (0.13 at step 1
    # measured); over the last 10 of 60 steps it trailed by 0.021 on average (measured), a sixth of that.
    first = abs(record.metrics[0]["critic/returns_mean"] - record.metrics[0]["critic/vpred_mean"])
    late = [abs(m["critic/returns_mean"] - m["critic/vpred_mean"]) for m in record.metrics[-10:]]
    assert sum(late) / len(late) < first / 2, (first, late)
    assert record.run["seams"]["trainer"]["critic"]["gamma"] == 1.0


def test_a_killed_and_resumed_run_keeps_its_critic(tmp_path):
    config = tmp_path / "short.toml"
    config.write_text(SHORT)
    full = tmp_path / "full"
    finish(rlvr("train", str(config), "--out", str(full)))
    cut = tmp_path / "cut"
    proc = rlvr("train", str(config), "--out", str(cut))
    deadline = time.monotonic() + 600
    while steps_done(cut) < 3:
        assert proc.poll() is None, proc.communicate()[0]
        assert time.monotonic() < deadline, "run made no progress"
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)  # after the warm-up: the critic has trained alone, then with the actor
    proc.wait()
    assert read_record(cut).finished is None
    assert any((cut / "checkpoints").glob("*/trainer/critic/value_head.safetensors"))
    finish(rlvr("resume", str(cut)))
    a, b = read_record(full), read_record(cut)
    assert [m["critic/warmup"] for m in a.metrics] == [1.0, 1.0, 0.0, 0.0]
    strip = lambda rows: [strip_timing(r) for r in rows]  # noqa: E731
    assert strip(b.metrics) == strip(a.metrics)
    assert b.heldout_scores == a.heldout_scores and len(b.of_kind("resumed")) == 1
