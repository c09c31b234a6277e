"""The CPU demo on two trainer ranks: ``rlvr train examples/addition.toml --nproc 2`` runs torchrun,
rank 0 records the run, and the policy learns.

Shortened to stay under three minutes on a 2-core machine: ``--loop.max_steps=60
--loop.heldout_every=20`` (the example's other settings, warm start included, are unchanged).
What "learns" asserts, and why its thresholds hold on any CPU, is in :data:`MIN_RISE` and
:data:`MIN_GAIN` (see tests/support/learning.py).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("peft")

from rlvr.record.run_record import read_record  # noqa: E402
from support.learning import heldout_gain, reward_rise  # noqa: E402

pytestmark = [pytest.mark.train, pytest.mark.slow]

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "addition.toml"
STEPS = 60
# Measured over 60 steps on an AMD EPYC, seeds 0-2 and seed 0 under ATEN_CPU_CAPABILITY=avx2 and
# =default (other kernels, so another trajectory from the same seed): training reward rise 0.058 to
# 0.113, held-out gain 0.144 to 0.224 (250 rows; measured before the split keyed rows by their
# normal form, which moved another demo test's gains by up to 0.04). An Intel Xeon with AMX reached a held-out gain of
# 0.068 by step 40 (a run's gain never falls as it goes on: it is its best evaluation's). Each
# threshold lies well under the lowest: the rise's more than two standard errors (0.015,
# tests/support/learning.py), the gain's under the Xeon's (a policy that is not trained has none at all).
MIN_RISE = 0.02
MIN_GAIN = 0.05


def test_the_demo_on_two_ranks_learns_and_records_the_group(tmp_path):
    out = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-m", "rlvr.cli", "train", str(EXAMPLE), "--out", str(out), "--nproc", "2",
                           f"--loop.max_steps={STEPS}", "--loop.heldout_every=20"],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count("selected: step") == 1  # rank 0 prints; the other rank is quiet
    record = read_record(out)
    assert sorted(record.pool_scores) == list(range(1, STEPS + 1))
    rise, gain = reward_rise(record.pool_scores), heldout_gain(record.heldout_scores)
    assert rise >= MIN_RISE and gain >= MIN_GAIN, f"training reward rise {rise:.3f}, held-out {record.heldout_scores}"
    trainer = json.loads((out / "run.json").read_text())["seams"]["trainer"]
    assert trainer["world_size"] == 2 and trainer["backend"] == "gloo"
