"""End-to-end runs of the CLI on a real tiny model: train, SIGKILL, resume, export.

Marked slow: they train for real (seconds to a minute each on two cores).
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

from rlvr.record.run_record import read_record, strip_timing  # noqa: E402

pytestmark = [pytest.mark.train, pytest.mark.slow]

SHORT = """
[loop]
max_steps = 8
tasks_per_step = 8
group_k = 4
temp = 1.0
heldout_every = 2
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

[sampler]
max_new_tokens = 5
"""


def rlvr(*args: str, **kwargs) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "rlvr.cli", *args]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **kwargs)


def finish(proc: subprocess.Popen, timeout: float = 300) -> str:
    out, _ = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, out
    return out


@pytest.fixture(scope="module")
def config(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("cfg") / "short.toml"
    path.write_text(SHORT)
    return path


@pytest.fixture(scope="module")
def uninterrupted(config, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("runs") / "full"
    finish(rlvr("train", str(config), "--out", str(out)))
    return out


def _steps_done(run: Path) -> int:
    path = run / "events.jsonl"
    if not path.exists():
        return 0
    return sum(1 for line in path.read_text().splitlines() if line.endswith("}") and '"kind": "step"' in line)


def test_sigkill_then_resume_matches_an_uninterrupted_run(config, uninterrupted, tmp_path):
    run = tmp_path / "killed"
    proc = rlvr("train", str(config), "--out", str(run))
    deadline = time.monotonic() + 300
    while _steps_done(run) < 5:
        assert proc.poll() is None, proc.communicate()[0]
        assert time.monotonic() < deadline, "run made no progress"
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    killed_at = _steps_done(run)
    assert killed_at < 8 and read_record(run).finished is None

    out = finish(rlvr("resume", str(run)))
    assert "selected: step" in out
    full, resumed = read_record(uninterrupted), read_record(run)
    assert resumed.selected_step == full.selected_step
    assert resumed.heldout_scores == full.heldout_scores
    assert resumed.pool_scores == full.pool_scores
    assert [e.data["task_ids"] for e in resumed.of_kind("step")] == [e.data["task_ids"] for e in full.of_kind("step")]
    assert len(resumed.of_kind("resumed")) == 1
    strip = lambda rows: [strip_timing(r) for r in rows]  # noqa: E731
    assert strip(resumed.metrics) == strip(full.metrics)


def test_export_writes_a_loadable_adapter_and_merged_model(uninterrupted, tmp_path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    finish(rlvr("export", str(uninterrupted), "--out", str(tmp_path / "exp")))
    meta = json.loads((tmp_path / "exp" / "export.json").read_text())
    assert meta["step"] == read_record(uninterrupted).selected_step
    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "exp" / "merged")
    AutoTokenizer.from_pretrained(tmp_path / "exp" / "merged")
    base = AutoModelForCausalLM.from_pretrained(uninterrupted / "base")
    with_adapter = PeftModel.from_pretrained(base, str(tmp_path / "exp" / "adapter")).merge_and_unload()
    for (name, a), (_, b) in zip(merged.state_dict().items(), with_adapter.state_dict().items(), strict=True):
        assert a.shape == b.shape and (a - b).abs().max() < 1e-5, name
    adapter_config = json.loads((tmp_path / "exp" / "adapter" / "adapter_config.json").read_text())
    assert adapter_config["base_model_name_or_path"] == "base"  # carried: the export holds the run's base
    assert (tmp_path / "exp" / "base" / "config.json").is_file()
    card = (tmp_path / "exp" / "README.md").read_text()
    assert card == (tmp_path / "exp" / "adapter" / "README.md").read_text()  # PEFT's blank template replaced
    assert f"checkpoint: step {meta['step']}" in card
    assert read_record(uninterrupted).run["split"]["heldout_hash"] in card


def test_record_of_a_real_run_is_complete(uninterrupted):
    record = read_record(uninterrupted)
    assert sorted(record.heldout_scores) == [0, 2, 4, 6, 8]
    assert record.finished.data["stop_cause"] == "max_steps"
    run = record.run
    assert run["versions"]["torch"] and run["split"]["n_heldout"] == 30
    assert run["cpu_threads"]["torch"] >= 1
    assert run["cpu_threads"]["omp_wait_policy"] == os.environ.get("OMP_WAIT_POLICY", "PASSIVE")
    selected = json.loads((uninterrupted / "selected.json").read_text())
    assert selected["baseline_heldout_score"] == record.heldout_scores[0]
    assert (uninterrupted / selected["checkpoint"] / "trainer" / "adapter" / "adapter_model.safetensors").exists()
    assert len(record.metrics) == 8 and all("loss/total" in m for m in record.metrics)
    # held-out and rollout generation took turns on the one device, and the record says so
    assert all(m["perf/gen/most_at_once"] == 1 for m in record.metrics)
    last = record.metrics[-1]
    assert last["perf/gen/rlvr-engine/calls"] >= 8 and last["perf/gen/rlvr-heldout/calls"] >= 4
    assert all(e.data["perf/gen/most_at_once"] == 1 for e in record.events if e.kind == "heldout")


def test_unknown_config_key_fails_naming_it(config, tmp_path):
    proc = rlvr("train", str(config), "--loop.bogus=1", "--out", str(tmp_path / "x"))
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 2 and "bogus" in out


def _children(pid: int) -> list[int]:
    out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True, check=False).stdout
    return [int(p) for p in out.split()]


def test_a_dead_server_stops_the_run_resumably_and_resume_finishes_it(config, tmp_path):
    run = tmp_path / "http"
    # A dead server refuses connections at once, whatever the timeout; a long one keeps a busy machine's
    # slow answers (the resumed run's) from failing the run.
    http = ["--sampler.backend=http", "--sampler.timeout_s=60", "--sampler.retries=1", "--loop.max_steps=10"]
    proc = rlvr("train", str(config), "--out", str(run), *http)
    deadline = time.monotonic() + 300
    while _steps_done(run) < 3:
        assert proc.poll() is None, proc.communicate()[0]
        assert time.monotonic() < deadline, "run made no progress"
        time.sleep(0.05)
    servers = _children(proc.pid)
    assert servers, "rlvr train started no server process"
    for pid in servers:
        os.kill(pid, signal.SIGKILL)  # the inference server dies mid-run
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode != 0
    assert "HTTP sampler" in out or "rlvr serve" in out, out[-2000:]  # a clear message, naming the server
    assert read_record(run).finished is None
    # The last checkpoint survives; resume starts a fresh server and finishes the run.
    out = finish(rlvr("resume", str(run)))
    record = read_record(run)
    assert record.finished.data["stop_cause"] == "max_steps" and len(record.of_kind("resumed")) == 1
    assert record.run["seams"]["weight_sync"]["lane"] == "lora_hot_load"
    assert record.run["seams"]["weight_sync"]["server"]["version"] == rlvr_version()


def rlvr_version() -> str:
    import rlvr as package

    return package.__version__


def test_two_same_seed_runs_write_the_same_metrics_and_weights(config, tmp_path):
    runs = [tmp_path / "a", tmp_path / "b"]
    said = [finish(rlvr("train", str(config), "--out", str(run), "--loop.max_steps=5")) for run in runs]
    a, b = (read_record(run) for run in runs)
    # Has this been tried? The second start names the first, an identical finished run, and what it reached.
    assert "has this been tried: no earlier run under" in said[0]
    assert (f"{runs[0]}: the same config; finished (max_steps) at step 5: selected step {a.selected_step}, "
            f"held-out {a.selected.get('heldout_score'):.3f}") in said[1]
    strip = lambda rows: [strip_timing(r) for r in rows]  # noqa: E731
    assert len(a.metrics) == 5 and strip(a.metrics) == strip(b.metrics)
    final = "checkpoints/step_000005/trainer/adapter/adapter_model.safetensors"
    assert (runs[0] / final).read_bytes() == (runs[1] / final).read_bytes()
