"""The run record on disk: required fields, read back equal, torn lines, strip_timing."""

from __future__ import annotations

import json

import pytest

from conftest import make_rig, small_config
from rlvr import GRPOConfig, RecordError, read_record
from rlvr.record.run_record import EventKind, RunRecorder, strip_timing


def run_to_disk(tmp_path, **config):
    rig = make_rig(small_config(**{"max_steps": 8, "heldout_every": 3, **config}), out_dir=tmp_path)
    return rig, rig.loop.run()


def read_jsonl(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_run_json_has_config_digest_seed_and_split_manifest(tmp_path):
    rig, _ = run_to_disk(tmp_path, seed=3)
    run = json.loads((tmp_path / "run.json").read_text())
    assert GRPOConfig(**run["config"]) == rig.loop.config
    assert run["config_sha256"] == rig.loop.config.digest()
    assert run["seed"] == 3
    split = run["split"]
    assert split["n_train"] == 30 and split["n_heldout"] == 10
    assert len(split["train_hash"]) == len(split["heldout_hash"]) == 64
    assert split["heldout_ids"] == sorted(t.id for t in rig.loop.heldout_tasks)
    assert run["seams"]["sampler"] == {"type": "rlvr.testing.FakeSampler", "seed": 0}
    assert "created_at" in run and "python" in run and "pydantic" in run["versions"]


def test_events_cover_the_run_and_heldout_events_carry_step_and_score(tmp_path):
    run_to_disk(tmp_path)
    events = read_jsonl(tmp_path / "events.jsonl")
    kinds = [e["kind"] for e in events]
    assert {"start", "step", "heldout", "checkpoint", "selected", "finished"} <= set(kinds)
    assert kinds[0] == "start" and kinds[-1] == "finished"
    assert all(isinstance(e["step"], int) and "time" in e for e in events)
    heldout = [e for e in events if e["kind"] == "heldout"]
    assert [e["step"] for e in heldout] == [0, 3, 6, 8]
    assert all(isinstance(e["score"], float) and e["n"] == 10 for e in heldout)
    steps = [e for e in events if e["kind"] == "step"]
    assert [len(e["task_ids"]) for e in steps] == [3] * 8
    assert events[-1]["stop_cause"] == "max_steps"


def test_metrics_have_one_row_per_step(tmp_path):
    run_to_disk(tmp_path)
    metrics = read_jsonl(tmp_path / "metrics.jsonl")
    assert [m["step"] for m in metrics] == list(range(1, 9))
    for m in metrics:
        assert 0.0 <= m["rollout/reward"] <= 1.0
        assert {"rollout/zero_std_frac", "rollout/completion_len", "train/loss", "perf/sample_wait_time",
                "perf/train_time", "perf/step_time", "perf/wait_time_ratio", "perf/overlap_ratio",
                "async/version_offset_max", "async/version_offset_mean", "rollout/filter_drop_ratio"} <= set(m)
        assert m["async/version_offset_max"] == 0  # the default O = 0 is on-policy


def test_selected_json_has_the_evidence(tmp_path):
    run_to_disk(tmp_path)
    selected = json.loads((tmp_path / "selected.json").read_text())
    assert {"step", "heldout_score", "baseline_heldout_score", "checkpoint", "heldout_scores"} <= set(selected)
    assert selected["heldout_scores"] == {"0": 0.1, "3": 0.13, "6": 0.16, "8": 0.18}
    assert selected["step"] == 8


def test_read_record_equals_the_in_memory_record(tmp_path):
    rig, record = run_to_disk(tmp_path)
    loaded = read_record(tmp_path)
    assert loaded.heldout_scores == record.heldout_scores == rig.loop.heldout_scores
    assert loaded.pool_scores == record.pool_scores == rig.loop.pool_scores
    assert loaded.selected_step == record.selected_step == rig.loop.selected_step == 8
    assert loaded.events == record.events
    assert loaded.metrics == record.metrics
    assert loaded.run == record.run and loaded.selected == record.selected
    assert all(isinstance(e.kind, EventKind) for e in loaded.events)
    assert loaded.finished.data["summary"]["selected_step"] == 8


def test_reader_tolerates_a_torn_last_line(tmp_path):
    _, record = run_to_disk(tmp_path)
    with open(tmp_path / "events.jsonl", "a") as f:
        f.write('{"kind": "step", "step": 9, "pool')
    with open(tmp_path / "metrics.jsonl", "a") as f:
        f.write('{"step": 9, "rollout/rew')
    loaded = read_record(tmp_path)
    assert loaded.events == record.events
    assert loaded.metrics == record.metrics


def test_reader_refuses_a_malformed_middle_line(tmp_path):
    run_to_disk(tmp_path)
    path = tmp_path / "events.jsonl"
    lines = path.read_text().splitlines(keepends=True)
    lines[3] = "{not json\n"
    path.write_text("".join(lines))
    with pytest.raises(RecordError, match=r"events\.jsonl:4: not a JSON line"):
        read_record(tmp_path)


def test_reader_refuses_a_folder_without_run_json(tmp_path):
    with pytest.raises(RecordError, match="no run.json here"):
        read_record(tmp_path)


def test_strip_timing_removes_wall_clock_keys_only():
    row = {"step": 3, "time": 1.5, "created_at": 2.0, "elapsed_s": 4.0, "perf/train_time": 0.1,
           "mem/rss_mb": 100.0, "rollout/reward": 0.5,
           "nested": [{"time": 1.0, "score": 0.2}], "summary": {"mem/peak": 1, "gain": 0.1}}
    assert strip_timing(row) == {"step": 3, "rollout/reward": 0.5, "nested": [{"score": 0.2}],
                                 "summary": {"gain": 0.1}}


def test_recorder_writes_non_finite_floats_as_null(tmp_path):
    recorder = RunRecorder(tmp_path, clock=lambda: 0.0)
    recorder.write_run_info({})
    recorder.metric(1, {"rollout/reward": float("nan"), "x": (1, 2)})
    assert read_jsonl(tmp_path / "metrics.jsonl") == [{"step": 1, "rollout/reward": None, "x": [1, 2]}]
    assert read_record(tmp_path).metrics == recorder.metrics


def test_a_steps_lines_are_written_at_once_and_fsynced_at_the_next_other_event_and_at_close(tmp_path, monkeypatch):
    """A step costs no disk flush: its lines are written (a process that dies keeps them) and reach the
    disk with the next checkpoint, held-out, selection or end event, or at close."""
    import os

    import rlvr.record.run_record as record_module

    synced: list[str] = []

    def fsync(fd: int) -> None:
        synced.append(os.path.basename(os.readlink(f"/proc/self/fd/{fd}")))
        real_fsync(fd)

    real_fsync = os.fsync
    monkeypatch.setattr(record_module.os, "fsync", fsync)
    recorder = RunRecorder(tmp_path, clock=lambda: 0.0)
    for step in (1, 2):
        recorder.event(EventKind.STEP, step)
        recorder.metric(step, {"rollout/reward": 0.5})
    assert synced == []
    assert [m["step"] for m in read_jsonl(tmp_path / "metrics.jsonl")] == [1, 2]  # written, readable now
    recorder.event(EventKind.CHECKPOINT, 2)
    assert synced == ["events.jsonl", "metrics.jsonl"]
    recorder.event(EventKind.STEP, 3)
    recorder.close()
    assert synced == ["events.jsonl", "metrics.jsonl", "events.jsonl"]  # only what was written since
