"""A run over two `rlvr serve` replicas, one SIGKILLed mid-run: it finishes on the other, and the
removal is in the run record and on the console."""

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

from rlvr.record.run_record import read_record  # noqa: E402

pytestmark = [pytest.mark.train, pytest.mark.slow]

CONFIG = """
[loop]
max_steps = 6
tasks_per_step = 8
group_k = 4
temp = 1.0
heldout_every = 3
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

[sampler]
max_new_tokens = 5
"""

REPLICAS = ["--sampler.backend=http", "--sampler.replicas=2", "--sampler.server_threads=1",
            "--sampler.timeout_s=10", "--sampler.retries=1"]


def rlvr(*args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "rlvr.cli", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


def _steps_done(run: Path) -> int:
    path = run / "events.jsonl"
    text = path.read_text() if path.exists() else ""
    return sum(1 for line in text.splitlines() if line.endswith("}") and '"kind": "step"' in line)


def _servers(pid: int) -> list[tuple[int, str]]:
    out = subprocess.run(["pgrep", "-a", "-P", str(pid)], capture_output=True, text=True, check=False).stdout
    return [(int(line.split()[0]), line) for line in out.splitlines() if " serve " in line]


def test_two_replicas_one_killed_mid_run_finishes_on_the_other(tmp_path):
    config = tmp_path / "short.toml"
    config.write_text(CONFIG)
    run = tmp_path / "replicas"
    proc = rlvr("train", str(config), "--out", str(run), *REPLICAS)
    deadline = time.monotonic() + 300
    while _steps_done(run) < 2:
        assert proc.poll() is None, proc.communicate()[0]
        assert time.monotonic() < deadline, "run made no progress"
        time.sleep(0.05)
    servers = _servers(proc.pid)
    assert len(servers) == 2, servers
    victim, line = servers[0]
    port = line.split("--port ")[1].split()[0]
    os.kill(victim, signal.SIGKILL)  # one inference server dies mid-run
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, out[-3000:]
    assert f"server http://127.0.0.1:{port} taken out of rotation" in out and "1 of 2 left" in out, out[-3000:]
    record = read_record(run)
    assert record.finished.data["stop_cause"] == "max_steps"
    (warning,) = [e for e in record.of_kind("warning") if e.data.get("warning") == "server_removed"]
    assert warning.data["server"] == f"http://127.0.0.1:{port}" and warning.data["servers_left"] == 1
    assert "killed by signal 9" in warning.data["reason"]
    servers_info = record.run["seams"]["weight_sync"]["servers"]
    assert len(servers_info) == 2 and all(s["lane"] == "lora_hot_load" for s in servers_info)
    assert (run / "servers" / "r0" / "server.log").exists() and (run / "servers" / "r1" / "server.log").exists()
