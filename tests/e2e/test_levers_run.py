"""The training levers in real runs of the CLI on the tiny model.

- The CPU demo (``examples/addition.toml``) with clip-higher on ``ppo``, a cosine schedule with a
  10% warmup, truncated completions masked and DAPO's overlong buffer learns over the demo's 200 steps:
  held-out gain > 0, a threshold an unlucky draw fails in under 1% of runs (bench/learning.py).
- A short run with the same levers (and two update epochs), SIGKILLed mid-warmup and resumed, records
  the same learning-rate curve, and the same metrics, as an uninterrupted one.

Marked slow: they train for real (a few minutes on two busy cores).
"""

from __future__ import annotations

import math
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
LEVERS = ["--train.policy_loss=ppo", "--train.clip_eps_high=0.28", "--train.lr_schedule=cosine",
          "--train.warmup_ratio=0.1", "--train.mask_truncated_completions=true", "--train.overlong_buffer=2"]
DEMO_STEPS = 200
MIN_GAIN = 0.0  # from the bench's spread over seeds: see the test

SHORT = """
[loop]
max_steps = 8
tasks_per_step = 8
group_k = 4
temp = 1.0
heldout_every = 4
checkpoint_every = 1
lr = 5e-3
lora_rank = 4
seed = 3
corpus_min = 100
heldout_frac = 0.2

[model]
hidden = 32
layers = 2
heads = 2
threads = 1

[task]
name = "addition"
n = 150

[sft]
steps = 30
batch_size = 32
lr = 3e-3

[train]
policy_loss = "dapo"
clip_eps_high = 0.28
lr_schedule = "cosine"
warmup_steps = 4
min_lr_ratio = 0.1
update_epochs = 2
mask_truncated_completions = true
overlong_buffer = 2

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


@pytest.fixture(scope="module")
def demo(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("runs") / "demo"
    finish(rlvr("train", str(EXAMPLE), "--out", str(out), f"--loop.max_steps={DEMO_STEPS}", "--model.threads=1",
                *LEVERS))
    return out


def test_the_demo_with_the_levers_learns(demo):
    record = read_record(demo)
    summary = record.finished.data["summary"]
    print(f"held-out {summary['baseline_heldout_score']:.3f} -> {summary['selected_heldout_score']:.3f} "
          f"(step {summary['selected_step']}), gain {summary['heldout_gain']:+.3f}")
    # `python bench/learning.py --recipes levers --seeds 5` (this run, seeds 0-4; AMD EPYC, 2 cores): gains
    # +0.100, +0.232, +0.340, +0.252, +0.392: mean +0.263, standard deviation 0.112. A gain at or under
    # mean - 2.33 sd = 0.003 comes in under 1% of draws with that spread (0.15, the threshold before, in
    # about 12%): so the guard is that the run improved on step 0 at all. How much the levers learn is
    # the bench's.
    assert summary["heldout_gain"] > MIN_GAIN, record.heldout_scores
    lrs = [m["train/lr"] for m in record.metrics]
    warmup = math.ceil(0.1 * DEMO_STEPS)
    assert lrs[:warmup] == pytest.approx([1e-4 * t / warmup for t in range(1, warmup + 1)])
    assert lrs[warmup] == pytest.approx(1e-4) and lrs[-1] < 1e-6  # cosine down towards 0
    assert all("reward/overlong" in m and "reward/unshaped" in m for m in record.metrics)
    assert record.run["run_config"]["train"]["clip_eps_high"] == 0.28


def test_killed_mid_warmup_and_resumed_a_run_keeps_its_learning_rate_curve(tmp_path):
    config = tmp_path / "short.toml"
    config.write_text(SHORT)
    full = tmp_path / "full"
    finish(rlvr("train", str(config), "--out", str(full)))
    cut = tmp_path / "cut"
    proc = rlvr("train", str(config), "--out", str(cut))
    deadline = time.monotonic() + 600
    while steps_done(cut) < 2:
        assert proc.poll() is None, proc.communicate()[0]
        assert time.monotonic() < deadline, "run made no progress"
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)  # mid-warmup: 4 warmup steps
    proc.wait()
    assert steps_done(cut) < 4 and read_record(cut).finished is None
    finish(rlvr("resume", str(cut)))
    a, b = read_record(full), read_record(cut)
    assert [m["train/lr"] for m in b.metrics] == [m["train/lr"] for m in a.metrics]
    assert [m["train/lr"] for m in a.metrics][:4] == pytest.approx([5e-3 * t / 4 for t in range(1, 5)])
    assert all(m["train/optimizer_steps"] == 2 for m in a.metrics)  # two update epochs a step
    strip = lambda rows: [strip_timing(r) for r in rows]  # noqa: E731
    assert strip(b.metrics) == strip(a.metrics)
    assert b.heldout_scores == a.heldout_scores and len(b.of_kind("resumed")) == 1
