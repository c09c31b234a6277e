"""The CPU demo with trainer ranks as Ray actors: ``rlvr train examples/addition.toml --nproc 2`` with
``--cluster.backend=ray`` trains what the same command under torchrun trains, records the trainer
actor, and a rank actor SIGKILLed mid-run stops the run naming it; ``rlvr resume`` then finishes it.

The reference is the torchrun run (``--nproc 2`` without Ray): it warm-starts the tiny model once,
and the Ray runs start from its ``base/`` (``--sft.steps=0``), so the only difference between the
two compared runs is who started rank 1. Same ranks, same threads per rank, same split: the weights
after 3 steps must agree within 1e-5 (measured: bitwise equal).
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

from ray_rig import require_ray  # noqa: E402
from rlvr.run.record import read_record  # noqa: E402

pytestmark = [pytest.mark.train, pytest.mark.slow]

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "addition.toml"
SHORT = ["--loop.max_steps=3", "--loop.heldout_every=3", "--loop.tasks_per_step=8", "--log.progress=plain"]
ON_RAY = ["--nproc", "2", "--cluster.backend=ray"]


def rlvr(*args: str, timeout: float = 400) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "rlvr.cli", *args], capture_output=True, text=True, timeout=timeout)


def from_base(run: Path) -> list[str]:
    return [f"--model.base={run / 'base'}", "--model.tiny=false", "--sft.steps=0"]


def last_weights(run: Path) -> dict:
    return weights_at(sorted((run / "checkpoints").glob("step_*"))[-1])


def max_diff(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k] - b[k]).abs().max()) for k in a)


@pytest.fixture(scope="module")
def torchrun_run(tmp_path_factory) -> Path:
    require_ray()
    run = tmp_path_factory.mktemp("torchrun") / "run"
    done = rlvr("train", str(EXAMPLE), "--out", str(run), "--nproc", "2", "--sft.target_accuracy=0.15", *SHORT)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    return run


def test_ranks_on_ray_train_what_torchrun_ranks_train_and_the_record_names_the_trainer_actor(torchrun_run, tmp_path):
    run = tmp_path / "ray"
    done = rlvr("train", str(EXAMPLE), "--out", str(run), *ON_RAY, *SHORT, *from_base(torchrun_run))
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    record = read_record(run)
    assert record.finished.data["stop_cause"] == "max_steps"
    cluster = record.run["cluster"]
    (actor,) = [a for a in cluster["actors"] if a["role"] == "trainer"]
    assert actor["rank"] == 1 and actor["name"] == "trainer rank 1" and actor["ip"] == "127.0.0.1"
    assert actor["pid"] and actor["node_id"] in {n["node_id"] for n in cluster["nodes"] if n["alive"]}
    trainer = record.run["seams"]["trainer"]
    assert trainer["world_size"] == 2 and trainer["backend"] == "gloo" and trainer["ranks_on"] == "ray"
    assert "trainer ranks 1..1 are Ray actors" in done.stdout
    steps = sorted((run / "checkpoints").glob("step_*"))
    assert [p.name for p in steps] == ["step_000000", "step_000003"]
    ray_weights = last_weights(run)
    assert max_diff(ray_weights, weights_at(steps[0])) > 1e-4  # the 3 steps moved the weights: a real comparison
    assert max_diff(ray_weights, last_weights(torchrun_run)) < 1e-5


def weights_at(checkpoint: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(checkpoint / "trainer" / "weights.safetensors")


def test_a_killed_rank_actor_stops_the_run_naming_it_and_resume_finishes_it(torchrun_run, tmp_path):
    run = tmp_path / "killed"
    proc = subprocess.Popen([sys.executable, "-m", "rlvr.cli", "train", str(EXAMPLE), "--out", str(run), *ON_RAY,
                             *SHORT, *from_base(torchrun_run)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    deadline = time.monotonic() + 300
    events = run / "events.jsonl"
    while not (events.exists() and '"kind": "step"' in events.read_text()):
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        assert time.monotonic() < deadline, "the run made no step"
        time.sleep(0.05)
    actors = json.loads((run / "run.json").read_text())["cluster"]["actors"]
    victim = next(a for a in actors if a["role"] == "trainer")
    os.kill(victim["pid"], signal.SIGKILL)
    killed_at = time.monotonic()
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 2, out[-2000:] + err[-3000:]
    assert time.monotonic() - killed_at < 60  # bounded: the closed connection or Ray's death notice, not a timeout
    said = f"trainer rank 1 (Ray actor on node {victim['ip']}, pid {victim['pid']}) died"
    assert said in err and "not restarted" in err and f"rlvr resume {run}" in err, err[-3000:]
    resumed = rlvr("resume", str(run), "--nproc", "2")
    assert resumed.returncode == 0, resumed.stdout[-2000:] + resumed.stderr[-3000:]
    assert read_record(run).finished.data["stop_cause"] == "max_steps"
