"""The CPU demo on two trainer ranks: ``rlvr train examples/addition.toml --nproc 2`` runs torchrun,
rank 0 records the run, and the policy learns.

Shortened to stay near two minutes on a 2-core machine: ``--loop.max_steps=40
--loop.heldout_every=20`` (the example's other settings, warm start included, are unchanged); the
held-out gain must still reach 15 points.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("peft")

from rlvr.run.record import read_record  # noqa: E402

pytestmark = [pytest.mark.train, pytest.mark.slow]

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "addition.toml"


def test_the_demo_on_two_ranks_learns_and_records_the_group(tmp_path):
    out = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-m", "rlvr.cli", "train", str(EXAMPLE), "--out", str(out), "--nproc", "2",
                           "--loop.max_steps=40", "--loop.heldout_every=20"],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count("selected: step") == 1  # rank 0 prints; the other rank is quiet
    record = read_record(out)
    scores = record.heldout_scores
    gain = max(scores.values()) - scores[0]
    assert gain >= 0.15, f"held-out {scores}"
    trainer = json.loads((out / "run.json").read_text())["seams"]["trainer"]
    assert trainer["world_size"] == 2 and trainer["backend"] == "gloo"
