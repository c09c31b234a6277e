"""End-to-end runs of the CLI sampling in a real vLLM server that rlvr starts: the server killed
mid-run ends the run with a clear message and `rlvr resume` finishes it; a server outside the
pinned window is refused before step 1; the record names vLLM's version and the lane.

Slow suite, skipped without vLLM (`make vllm`; ``RLVR_REQUIRE_VLLM=1`` makes that a failure).
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
pytest.importorskip("httpx")

from rlvr.record.run_record import read_record  # noqa: E402
from support.vllm_rig import LEAN_ENV, start_vllm, vllm_python  # noqa: E402

pytestmark = [pytest.mark.train, pytest.mark.slow, pytest.mark.vllm]

# A short warm start so that rewards differ within groups and steps train on tokens; the mechanics
# are under test, not the learning. temp != 1 so that log-probs of the wrong kind (vLLM's raw ones)
# would show as a large sampler/trainer mismatch.
CONFIG = """
[loop]
max_steps = 6
tasks_per_step = 4
group_k = 4
temp = 0.7
heldout_every = 2
lr = 5e-3
lora_rank = 4
seed = 0
corpus_min = 50
heldout_frac = 0.2

[model]
hidden = 64          # vLLM's CPU attention needs head_dim >= 32
layers = 2
heads = 2
threads = 1

[task]
name = "addition"
n = 60

[sft]
steps = 60
batch_size = 32
lr = 3e-3

[train]
tis_cap = 2.0

[sampler]
max_new_tokens = 4
backend = "vllm"
vllm_kv_cache_gib = 1
vllm_args = ["--enforce-eager", "--distributed-executor-backend=uni"]   # a lean start: see vllm_rig.LEAN_ARGS
"""


def rlvr(*args: str) -> subprocess.Popen:
    env = {**os.environ, "RLVR_VLLM_PYTHON": vllm_python(), **LEAN_ENV}
    return subprocess.Popen([sys.executable, "-m", "rlvr.cli", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env=env)


def steps_done(run: Path) -> int:
    path = run / "events.jsonl"
    return sum('"kind": "step"' in line for line in path.read_text().splitlines()) if path.exists() else 0


def checkpoints(run: Path) -> list[str]:
    return sorted(p.name for p in (run / "checkpoints").glob("step_*")) if (run / "checkpoints").exists() else []


def server_pids(run: Path, parent: int | None = None) -> list[int]:
    """The vLLM processes serving ``run/base`` (its engine processes share the command line);
    with ``parent``, only the API server that process started."""
    args = ["pgrep", "-f", f"vllm.entrypoints.openai.api_server --model {run / 'base'}"]
    found = subprocess.run(args + (["-P", str(parent)] if parent else []), capture_output=True, text=True)
    return [int(p) for p in found.stdout.split()]


@pytest.fixture
def config(tmp_path) -> Path:
    path = tmp_path / "vllm.toml"
    path.write_text(CONFIG)
    return path


def test_a_killed_vllm_server_ends_the_run_clearly_and_resume_finishes_it(config, tmp_path):
    run = tmp_path / "run"
    proc = rlvr("train", str(config), "--out", str(run))
    deadline = time.monotonic() + 600
    while "step_000002" not in checkpoints(run):
        assert proc.poll() is None, proc.communicate()[0]
        assert time.monotonic() < deadline, "the run made no progress"
        time.sleep(0.2)
    os.kill(proc.pid, signal.SIGSTOP)  # hold the run still (steps take well under a second) while its server dies
    pids = server_pids(run, parent=proc.pid)
    assert len(pids) == 1, pids
    os.kill(pids[0], signal.SIGKILL)
    os.kill(proc.pid, signal.SIGCONT)
    out, _ = proc.communicate(timeout=600)
    assert proc.returncode not in (0, None), out
    assert "vLLM server that rlvr started" in out and "killed by signal 9" in out, out[-3000:]
    assert str(run / "server.log") in out and f"`rlvr resume {run}` continues it" in out
    assert read_record(run).finished is None and steps_done(run) < 6

    resumed = rlvr("resume", str(run))
    out, _ = resumed.communicate(timeout=900)
    assert resumed.returncode == 0, out[-3000:]
    record = read_record(run)
    assert record.finished.data["stop_cause"] == "max_steps" and steps_done(run) >= 6
    assert len(record.of_kind("resumed")) == 1
    lane = record.run["seams"]["weight_sync"]
    assert lane["lane"] == "lora_hot_load" and lane["server_api"] == "vllm"
    assert lane["server"]["version"] == "0.32.0"
    # vLLM's log-probs (processed, at temp 0.7) are the trainer's own up to float error.
    mismatch = [m["train/mismatch_kl"] for m in record.metrics]
    assert len(mismatch) >= 6 and all(math.isfinite(x) and abs(x) < 1e-3 for x in mismatch), mismatch
    assert not server_pids(run)  # stopped with the run


def test_a_vllm_outside_the_pinned_window_is_refused_before_step_1(config, tmp_path):
    from rlvr.backends.model.tiny import build_tiny_model

    base = build_tiny_model(tmp_path / "tiny", hidden=64, layers=2, heads=2)
    server = start_vllm(base, tmp_path, lora_rank=4, max_loras=2)
    try:
        run = tmp_path / "refused"
        proc = rlvr("train", str(config), "--out", str(run), f"--sampler.url={server.url}",
                    "--loop.vllm_pin=>=0.40")
        out, _ = proc.communicate(timeout=600)
    finally:
        server.stop()
    assert proc.returncode != 0
    assert "runs version '0.32.0', outside the compatible window '>=0.40'" in out, out[-3000:]
    # A start refused before step 1 leaves no run folder behind: the same command may be run again.
    assert not run.exists() or not any(run.iterdir()), sorted(p.name for p in run.iterdir())
