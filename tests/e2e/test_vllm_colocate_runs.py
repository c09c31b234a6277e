"""The CPU demo with vLLM inside the training process (``sampler.backend = "vllm_colocate"``), run by
the CLI from vLLM's own interpreter: the LoRA demo and a full fine-tune both learn, every step's
sampler/trainer mismatch stays at float error, and no weights are written to disk to reach the
engine (no sync folder, no adapter or safetensors file outside the base and the checkpoints).

Shortened as the two-rank demo test is (``--loop.max_steps=40 --loop.heldout_every=20``); the full
fine-tune starts from the LoRA run's warm-started base (``--model.base``, no second SFT), which was
warm-started on the same split's training rows only.

Slow suite, skipped without vLLM (`make vllm`; ``RLVR_REQUIRE_VLLM=1`` makes that a failure).
"""

from __future__ import annotations

import json
import math
import os
import subprocess
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("peft")

from rlvr.run.record import read_record  # noqa: E402
from vllm_rig import vllm_python  # noqa: E402

pytestmark = [pytest.mark.train, pytest.mark.slow, pytest.mark.vllm]

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "addition_vllm_colocate.toml"
SHORT = ["--loop.max_steps=40", "--loop.heldout_every=20"]
SRC = str(Path(__file__).resolve().parents[2] / "src")


def train(out: Path, *overrides: str) -> subprocess.CompletedProcess:
    """``rlvr train`` on the colocated example from vLLM's interpreter (this checkout's rlvr first)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [SRC, os.environ.get("PYTHONPATH")]))}
    return subprocess.run([vllm_python(), "-m", "rlvr.cli", "train", str(EXAMPLE), "--out", str(out), *SHORT,
                           *overrides], capture_output=True, text=True, timeout=1500, env=env)


def weight_files(run: Path) -> list[str]:
    """Weight files of the run folder outside its base and checkpoints (where sync would write them)."""
    found = [p for ext in ("*.safetensors", "*.bin", "*.pt") for p in run.rglob(ext)]
    return sorted(str(p.relative_to(run)) for p in found if p.relative_to(run).parts[0] not in ("base", "checkpoints"))


def check_colocated_run(run: Path, proc: subprocess.CompletedProcess, weights: str) -> dict:
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    record = read_record(run)
    scores = record.heldout_scores
    assert max(scores.values()) - scores[0] >= 0.15, f"held-out {scores}"
    mismatch = [m["train/mismatch_kl"] for m in record.metrics]
    assert len(mismatch) == 40 and all(math.isfinite(x) and abs(x) < 1e-3 for x in mismatch), mismatch
    assert not (run / "sync").exists() and weight_files(run) == []
    assert not (run / "server.log").exists()
    lane = json.loads((run / "run.json").read_text())["seams"]["weight_sync"]
    assert lane["lane"] == "vllm_colocate" and lane["transport"] == "in memory" and lane["weights"] == weights
    assert lane["verify"]  # every publish checked the served log-probs of a probe against the trainer's
    engine = lane["engine"]
    assert engine["vllm"].startswith("0.32") and engine["device"] == "cpu"
    assert engine["sleep_mode"].startswith("unavailable")  # no sleep mode on vLLM's CPU backend, and the record says so
    assert engine["engine_args"]["logprobs_mode"] == "processed_logprobs"
    return lane


@pytest.fixture(scope="module")
def lora_run(tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess]:
    run = tmp_path_factory.mktemp("colocated") / "lora"
    return run, train(run)


def test_the_lora_demo_learns_with_vllm_in_the_training_process(lora_run):
    run, proc = lora_run
    check_colocated_run(run, proc, "base + merged LoRA delta")


def test_a_full_fine_tune_learns_with_every_weight_pushed_in_memory(lora_run, tmp_path):
    base = lora_run[0] / "base"
    assert (base / "config.json").exists(), "the LoRA run left no warm-started base"
    run = tmp_path / "full"
    proc = train(run, f"--model.base={base}", "--model.tiny=false", "--sft.steps=0", "--loop.lora_rank=0",
                 "--loop.lr=1e-4")
    check_colocated_run(run, proc, "all parameters")
