"""Unattended runs through the CLI on the tiny model: the memory watchdog stops a run and `rlvr
resume` finishes it; `rlvr queue` drains in order under a lock; a run starts from another run's
exported adapter. Marked slow: each trains for real (seconds per run on two cores)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("peft")

from rlvr.record.run_record import read_record  # noqa: E402

pytestmark = [pytest.mark.train, pytest.mark.slow]

TINY = """
[loop]
max_steps = 2
tasks_per_step = 4
group_k = 2
heldout_every = 1
lora_rank = 4
lr = 5e-3
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
n = 120

[sampler]
max_new_tokens = 5
"""


def rlvr(*args: str, timeout: float = 180) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "rlvr.cli", *map(str, args)], capture_output=True, text=True,
                          timeout=timeout)


@pytest.fixture
def config(tmp_path: Path) -> Path:
    path = tmp_path / "tiny.toml"
    path.write_text(TINY)
    return path


def test_the_watchdog_stops_a_run_cleanly_and_resume_finishes_it(tmp_path, config):
    out = tmp_path / "run"
    stopped = rlvr("train", config, "--out", out, "--watchdog.max_rss_mb=1", "--watchdog.persist_s=0")
    assert stopped.returncode == 75, stopped.stderr
    assert f"`rlvr resume {out}` continues it" in stopped.stderr
    record = read_record(out)
    aborted = [e for e in record.events if str(e.kind) == "aborted"]
    assert "over the floor of 1 MiB" in aborted[0].data["reason"] and aborted[0].data["mem/rss_mb"] > 1
    assert record.finished.data["stop_cause"] == "aborted"
    assert (out / "checkpoints" / "step_000000" / "loop_state.json").exists()

    resumed = rlvr("resume", out, "--watchdog.max_rss_mb=1000000")
    assert resumed.returncode == 0, resumed.stderr
    record = read_record(out)
    assert record.finished.data["stop_cause"] == "max_steps" and sorted(record.heldout_scores) == [0, 1, 2]
    after = [e.data["after_abort"] for e in record.events if str(e.kind) == "resumed"]
    assert "over the floor of 1 MiB" in after[0]["reason"]
    assert all("mem/train_peak_mb" in m for m in record.metrics)
    assert rlvr("resume", out, "--loop.lr=1").returncode == 2  # only the watchdog may change


def test_queue_drains_in_order_under_a_lock_and_records_a_failure(tmp_path, config):
    queue = tmp_path / "queue"
    outs = [tmp_path / f"run{i}" for i in range(3)]
    for i, out in enumerate(outs):
        extra = ["--task.data=" + str(tmp_path / "missing.jsonl"), "--task.env=exact_match"] if i == 1 else []
        added = rlvr("queue", "add", config, "--out", out, "--queue", queue, "--loop.max_steps=1", *extra)
        assert added.returncode == 0, added.stderr
    first = subprocess.Popen([sys.executable, "-m", "rlvr.cli", "queue", "run", "--queue", str(queue)],
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 60
        while not (queue / "lock").exists() or not (queue / "lock").read_text().strip():
            assert time.monotonic() < deadline and first.poll() is None
            time.sleep(0.1)
        t0 = time.monotonic()
        second = rlvr("queue", "run", "--queue", queue)
        assert second.returncode == 3 and "is being drained by pid" in second.stdout
        assert time.monotonic() - t0 < 20  # exits at once (the time is interpreter start-up)
        assert first.wait(timeout=240) == 0
    finally:
        if first.poll() is None:
            first.kill()
    entries = [json.loads(p.read_text()) for p in sorted((queue / "entries").glob("*.json"))]
    assert [e["state"] for e in entries] == ["done", "failed", "done"]
    assert entries[1]["exit_status"] == 2 and "missing.jsonl" in Path(entries[1]["log"]).read_text()
    starts = [e["started_at"] for e in entries]
    assert starts == sorted(starts) and entries[0]["finished_at"] <= entries[1]["started_at"]
    for i in (0, 2):
        assert read_record(outs[i]).finished.data["stop_cause"] == "max_steps"
    budget = json.loads((queue / "budget.json").read_text())
    assert sum(day["runs"] for day in budget.values()) == 3
    listing = rlvr("queue", "ls", "--queue", queue)
    assert listing.returncode == 0 and listing.stdout.count("done") == 2 and "failed" in listing.stdout
    # The pre-flight of the third run found the first (the same config) and took its measured peak.
    assert entries[2]["preflight"]["go"] and entries[2]["preflight"]["peak_basis"] == f"measured in {outs[0]}"
    morning = rlvr("queue", "summary", "--queue", queue)
    lines = morning.stdout.splitlines()
    assert morning.returncode == 0
    assert lines[0].startswith(f"queue {queue}, last 12 h: ran 3 (2 done, 1 failed) · peak ")
    assert [line.split()[:2] for line in lines[1:]] == [["#1", "done"], ["#2", "failed"], ["#3", "done"]]
    assert "peak ? " in lines[2] and all(" MB " in line for line in (lines[1], lines[3]))
    # The budget: nothing queued is started once --max-runs is spent.
    rlvr("queue", "add", config, "--out", tmp_path / "run3", "--queue", queue)
    capped = rlvr("queue", "run", "--queue", queue, "--max-runs", "0")
    assert capped.returncode == 0 and "budget reached" in capped.stdout and not (tmp_path / "run3").exists()


def test_a_run_starts_from_another_runs_exported_adapter(tmp_path, config):
    source = tmp_path / "source"
    trained = rlvr("train", config, "--out", source, "--loop.max_steps=3", "--sft.steps=30", "--sft.batch_size=32",
                   "--sft.lr=3e-3")
    assert trained.returncode == 0, trained.stderr
    exported = rlvr("export", source, "--step", "3", "--out", tmp_path / "export")
    assert exported.returncode == 0, exported.stderr
    adapter = tmp_path / "export" / "adapter"
    src_score = read_record(source).heldout_scores[3]

    # The same base the adapter was trained on (the source's warm-started base/), no warm start of its own.
    start = tmp_path / "start"
    args = ["--out", start, "--model.base=" + str(source / "base"), "--model.tiny=false", "--sft.steps=0",
            "--model.adapter_init=" + str(tmp_path / "export"), "--loop.max_steps=1"]
    begun = rlvr("train", config, *args)
    assert begun.returncode == 0, begun.stderr
    record = read_record(start)
    assert record.heldout_scores[0] == src_score
    lineage = record.run["adapter_init"]
    assert lineage["path"] == str(adapter.resolve()) and len(lineage["sha256"]) == 64

    from safetensors.torch import load_file

    given = load_file(adapter / "adapter_model.safetensors")
    at_zero = load_file(start / "checkpoints" / "step_000000" / "trainer" / "adapter" / "adapter_model.safetensors")
    assert given.keys() == at_zero.keys() and all((given[k] == at_zero[k]).all() for k in given)

    wrong = rlvr("train", config, "--out", tmp_path / "wrong", "--loop.lora_rank=8",
                 "--model.adapter_init=" + str(adapter))
    assert wrong.returncode == 2 and "loop.lora_rank = 8 but the adapter has 4" in wrong.stderr
    assert not (tmp_path / "wrong").exists()  # refused before anything was written
    not_one = rlvr("train", config, "--out", tmp_path / "n", "--model.adapter_init=" + str(tmp_path))
    assert not_one.returncode == 2 and "is not a PEFT adapter" in not_one.stderr
