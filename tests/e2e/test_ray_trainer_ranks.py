"""The CPU demo with trainer ranks as Ray actors: ``rlvr train examples/addition.toml --nproc 2`` with
``--cluster.backend=ray`` trains on a rank actor that the record names; that actor SIGKILLed after
the first step stops the run naming it, and ``rlvr resume --nproc 2`` on Ray finishes the run.

That ranks started by Ray train exactly what ranks started by torchrun train is not re-run here: both
run the same rank loop (``rlvr.wiring.scale.ranks.serve``) after joining the same way, and 2 ranks against one
process is checked, within the float32 tolerance of tests/support/dp_rig.py, in
tests/backends/test_data_parallel.py. Every checkpoint compares the
ranks' weight digests, so the resumed run's checkpoints prove the actor rank stayed in step.
"""

from __future__ import annotations

import json
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
from support.ray_rig import require_ray  # noqa: E402

pytestmark = [pytest.mark.train, pytest.mark.slow]

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "addition.toml"
SHORT = ["--loop.max_steps=3", "--loop.heldout_every=3", "--loop.tasks_per_step=8", "--log.progress=plain"]
ON_RAY = ["--nproc", "2", "--cluster.backend=ray"]


def rlvr(*args: str, timeout: float = 400) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "rlvr.cli", *args], capture_output=True, text=True, timeout=timeout)


def max_diff(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k] - b[k]).abs().max()) for k in a)


def weights_at(checkpoint: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(checkpoint / "trainer" / "weights.safetensors")


def test_rank_actor_is_recorded_and_its_death_stops_the_run_naming_it_and_resume_finishes_it(tmp_path):
    require_ray()
    run = tmp_path / "killed"
    proc = subprocess.Popen([sys.executable, "-m", "rlvr.cli", "train", str(EXAMPLE), "--out", str(run), *ON_RAY,
                             *SHORT, "--sft.target_accuracy=0.15"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    deadline = time.monotonic() + 300
    events = run / "events.jsonl"
    while not (events.exists() and '"kind": "step"' in events.read_text()):
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        assert time.monotonic() < deadline, "the run made no step"
        time.sleep(0.05)
    cluster = json.loads((run / "run.json").read_text())["cluster"]
    (victim,) = [a for a in cluster["actors"] if a["role"] == "trainer"]
    assert victim["rank"] == 1 and victim["name"] == "trainer rank 1" and victim["ip"] == "127.0.0.1"
    assert victim["pid"] and victim["node_id"] in {n["node_id"] for n in cluster["nodes"] if n["alive"]}
    os.kill(victim["pid"], signal.SIGKILL)
    killed_at = time.monotonic()
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 2, out[-2000:] + err[-3000:]
    assert "trainer ranks 1..1 are Ray actors" in out
    assert time.monotonic() - killed_at < 60  # bounded: the closed connection or Ray's death notice, not a timeout
    said = f"trainer rank 1 (Ray actor on node {victim['ip']}, pid {victim['pid']}) died"
    assert said in err and "not restarted" in err and f"rlvr resume {run}" in err, err[-3000:]

    resumed = rlvr("resume", str(run), "--nproc", "2")
    assert resumed.returncode == 0, resumed.stdout[-2000:] + resumed.stderr[-3000:]
    record = read_record(run)
    assert record.finished.data["stop_cause"] == "max_steps"
    trainer = record.run["seams"]["trainer"]
    assert trainer["world_size"] == 2 and trainer["backend"] == "gloo" and trainer["ranks_on"] == "ray"
    steps = sorted((run / "checkpoints").glob("step_*"))
    assert steps[0].name == "step_000000" and steps[-1].name == "step_000003"
    assert max_diff(weights_at(steps[-1]), weights_at(steps[0])) > 1e-4  # the resumed ranks trained
