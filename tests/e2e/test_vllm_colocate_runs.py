"""vLLM inside the training process (``sampler.backend = "vllm_colocate"``) on a real vLLM, from vLLM's
own interpreter. The engine's contract (tests/support/vllm_colocate_check.py): a completion depends on its
prompt and seed only, its log-probs are the trainer's at the sampling temperature (greedy, scored
too), allowed/forbidden tokens and stop tokens are honoured, and pushed weights are served (merged
LoRA pushes are checked by every step of the LoRA run). The CPU demo run by the CLI: the LoRA demo
and a full fine-tune both learn, every step's sampler/trainer mismatch stays at float error, and no
weights are written to disk to reach the engine (no sync folder, no adapter or safetensors file
outside the base and the checkpoints).

Shortened to 120 of the demo's 200 steps (``--loop.max_steps=120``, held-out every 10); the full
fine-tune starts from the LoRA run's warm-started base (``--model.base``, no second SFT), which was
warm-started on the same split's training rows only. Each run trains every step over tokens the
engine sampled with the trainer's weights (the mismatch at float error, each publish verified); its
held-out gain is one draw and not asserted (LoRA +0.200 and full +0.200 at step 120 on the split
before the split by prompt twins): how much the demo learns is the bench's, over seeds
(docs/benchmarks.md).

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

from rlvr.record.run_record import read_record  # noqa: E402
from support.vllm_rig import vllm_python  # noqa: E402

pytestmark = [pytest.mark.train, pytest.mark.slow, pytest.mark.vllm]

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "addition_vllm_colocate.toml"
STEPS = 120
SHORT = [f"--loop.max_steps={STEPS}", "--loop.heldout_every=10"]
SRC = str(Path(__file__).resolve().parents[2] / "src")


CHECK = Path(__file__).resolve().parents[1] / "support" / "vllm_colocate_check.py"


def in_vllm(*args: str, timeout: float) -> subprocess.CompletedProcess:
    """``python ARGS`` with vLLM's interpreter, this checkout's rlvr first on the path."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [SRC, os.environ.get("PYTHONPATH")]))}
    return subprocess.run([vllm_python(), *args], capture_output=True, text=True, timeout=timeout, env=env)


def train(out: Path, *overrides: str) -> subprocess.CompletedProcess:
    """``rlvr train`` on the colocated example."""
    return in_vllm("-m", "rlvr.cli", "train", str(EXAMPLE), "--out", str(out), *SHORT, *overrides, timeout=1500)


def test_the_colocated_engine_keeps_the_sampling_contract_and_serves_pushed_weights(tmp_path):
    proc = in_vllm(str(CHECK), str(tmp_path), "full", timeout=600)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("CHECK ")]
    assert proc.returncode == 0 and lines, (proc.stdout + proc.stderr)[-4000:]
    got = json.loads(lines[-1].removeprefix("CHECK "))
    assert got["threads_kept"]  # vLLM's CPU worker lowers torch's threads; the trainer gets its own back
    assert max(got["push_gaps"]) < 1e-4  # the probe after each push: the engine serves the moved weights
    assert "exceeds the engine's max_model_len" in got["too_long"]
    assert got["same_seed_same_completion"] and got["version"] == 0
    assert max(got["tempered_gap"], got["greedy_gap"], got["score_gap"]) < 1e-4
    assert got["allowed_only"] and got["banned_avoided"]
    ids, stop_token, reason = got["stop_kept"]
    assert ids[-1] == stop_token and reason == "stop"  # a stop token ends the completion and is kept in it
    assert got["refusals"]["parsed"] == {"enforce_eager": True, "max_num_seqs": 64}
    assert "sets --logprobs-mode" in got["refusals"]["owned"]


def weight_files(run: Path) -> list[str]:
    """Weight files of the run folder outside its base and checkpoints (where sync would write them)."""
    found = [p for ext in ("*.safetensors", "*.bin", "*.pt") for p in run.rglob(ext)]
    return sorted(str(p.relative_to(run)) for p in found if p.relative_to(run).parts[0] not in ("base", "checkpoints"))


def check_colocated_run(run: Path, proc: subprocess.CompletedProcess, weights: str) -> dict:
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    record = read_record(run)
    scores = record.heldout_scores
    print(f"held-out {scores}")
    assert sorted(scores) == list(range(0, STEPS + 1, 10))
    mismatch = [m["train/mismatch_kl"] for m in record.metrics]
    assert len(mismatch) == STEPS and all(math.isfinite(x) and abs(x) < 1e-3 for x in mismatch), mismatch
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


def test_the_lora_demo_trains_with_vllm_in_the_training_process(lora_run):
    run, proc = lora_run
    check_colocated_run(run, proc, "base + merged LoRA delta")


def test_a_full_fine_tune_trains_with_every_weight_pushed_in_memory(lora_run, tmp_path):
    base = lora_run[0] / "base"
    assert (base / "config.json").exists(), "the LoRA run left no warm-started base"
    run = tmp_path / "full"
    proc = train(run, f"--model.base={base}", "--model.tiny=false", "--sft.steps=0", "--loop.lora_rank=0",
                 "--loop.lr=1e-4")
    check_colocated_run(run, proc, "all parameters")
