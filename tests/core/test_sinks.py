"""Metric sinks and sample completions, with fakes: a sink sees what the record holds (same steps,
same values, held-out as heldout/...), a sink that fails is warned about once and left out while
the run and the other sinks go on, and samples/step_N.jsonl is written at the scheduled steps."""

from __future__ import annotations

import json

from conftest import AbortAfter, make_rig, small_config
from rlvr import read_record
from rlvr.protocols import MetricSink
from rlvr.record.sinks import SampleSchedule, SinkFanout, prompt_text, sample_rows
from rlvr.testing import FakeSampler
from rlvr.types import Group, Rollout, Task


class ListSink:
    """Keeps every call, in order."""

    def __init__(self, name: str = "list"):
        self.name = name
        self.configs: list[dict] = []
        self.metrics: list[tuple[int, dict]] = []
        self.samples: list[tuple[int, list]] = []
        self.closed = 0

    def log_config(self, config):
        self.configs.append(dict(config))

    def log_metrics(self, step, scalars):
        self.metrics.append((step, dict(scalars)))

    def log_samples(self, step, rows):
        self.samples.append((step, list(rows)))

    def close(self):
        self.closed += 1


class BrokenSink(ListSink):
    """Fails on its ``at``-th metrics call (a full disk, a tracker's bug)."""

    def __init__(self, at: int = 3):
        super().__init__("broken")
        self.at, self.calls = at, 0

    def log_metrics(self, step, scalars):
        self.calls += 1
        if self.calls == self.at:
            raise OSError("No space left on device")
        super().log_metrics(step, scalars)


def test_a_sink_sees_every_step_of_metrics_jsonl_with_the_same_values(tmp_path):
    sink = ListSink()
    assert isinstance(sink, MetricSink)
    rig = make_rig(small_config(max_steps=5, heldout_every=2), out_dir=tmp_path, sinks=[sink])
    record = rig.loop.run()
    on_disk = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    steps = [(s, m) for s, m in sink.metrics if "rollout/reward" in m]
    assert [s for s, _ in steps] == [row["step"] for row in on_disk] == [1, 2, 3, 4, 5]
    for (_, logged), row in zip(steps, on_disk, strict=True):
        assert logged["rollout/reward"] == row["rollout/reward"]
        assert logged["perf/step_time"] == row["perf/step_time"]
        assert "step" not in logged
    heldout = {s: m["heldout/score"] for s, m in sink.metrics if "heldout/score" in m}
    assert heldout == record.heldout_scores
    assert sink.configs == [record.run]  # the config once, as run.json holds it
    assert sink.closed == 1


def test_a_failing_sink_is_warned_once_and_the_run_goes_on_with_the_others(tmp_path, capsys):
    good, broken = ListSink(), BrokenSink(at=3)
    rig = make_rig(small_config(max_steps=6, heldout_every=3), out_dir=tmp_path, sinks=[broken, good])
    record = rig.loop.run()
    assert record.finished.data["stop_cause"] == "max_steps"
    warned = [line for line in capsys.readouterr().err.splitlines() if "metric sink" in line]
    assert len(warned) == 1 and "'broken'" in warned[0] and "No space left" in warned[0]
    assert broken.calls == 3 and broken.closed == 1  # never called again after failing
    assert [s for s, m in good.metrics if "rollout/reward" in m] == [1, 2, 3, 4, 5, 6]
    assert rig.loop.recorder.sinks.failed == {"broken": "log_metrics at step 2: OSError: No space left on device"}


def test_a_sink_that_fails_to_close_is_reported_without_failing_the_run():
    class Unclosable(ListSink):
        def close(self):
            raise RuntimeError("flush failed")

    warnings: list[str] = []
    fanout = SinkFanout([Unclosable("u")], warn=warnings.append)
    fanout.log_metrics(1, {"a": 1.0, "flag": True, "text": "x", "none": None})
    fanout.close()
    assert fanout.sinks == [] and len(warnings) == 1 and "flush failed" in warnings[0]


def test_the_recorder_records_a_sink_failure_as_a_warning_event(tmp_path):
    broken = BrokenSink(at=1)
    record = make_rig(small_config(max_steps=2), out_dir=tmp_path, sinks=[broken]).loop.run()
    warned = [e for e in read_record(tmp_path).events if str(e.kind) == "warning"]
    assert len(warned) == 1 and warned[0].data["sink"] == "broken"
    assert "OSError" in warned[0].data["reason"]
    assert record.finished is not None


def test_samples_are_written_at_the_scheduled_steps_and_read_back(tmp_path):
    sink = ListSink()
    cfg = small_config(max_steps=6, group_k=2, tasks_per_step=3)
    make_rig(cfg, out_dir=tmp_path, sinks=[sink], samples=SampleSchedule(every=2, groups=2)).loop.run()
    files = sorted(p.name for p in (tmp_path / "samples").iterdir())
    assert files == ["step_000002.jsonl", "step_000004.jsonl", "step_000006.jsonl"]
    record = read_record(tmp_path)
    assert sorted(record.samples) == [2, 4, 6]
    rows = record.samples[4]
    assert len(rows) == 2 * cfg.group_k  # two groups, every completion of each
    assert {r["group"] for r in rows} == {0, 1}
    for r in rows:
        assert r["step"] == 4 and r["version"] == 3  # sampled by the policy before step 4 (synchronous)
        assert r["completion"] and r["prompt"] and r["reward"] in (0.0, 1.0)
        assert isinstance(r["advantage"], float)
    step_events = {e.step: e.data["task_ids"] for e in record.events if str(e.kind) == "step"}
    assert [r["task_id"] for r in rows][:: cfg.group_k] == step_events[4][:2]
    assert [(s, rows_) for s, rows_ in sink.samples] == sorted(record.samples.items())


def test_no_samples_without_a_schedule(tmp_path):
    make_rig(small_config(max_steps=3), out_dir=tmp_path).loop.run()
    assert not (tmp_path / "samples").exists()
    assert read_record(tmp_path).samples == {}


def test_resume_keeps_the_samples_before_the_checkpoint_and_rewrites_the_rest(tmp_path):
    cfg = small_config(max_steps=8, heldout_every=3, tasks_per_step=3, group_k=2)
    schedule = SampleSchedule(every=1, groups=1)
    first = make_rig(cfg, out_dir=tmp_path, samples=schedule, should_abort=AbortAfter(4), sampler_cls=FakeSampler)
    first.loop.run()
    sink = ListSink()
    again = make_rig(cfg, out_dir=tmp_path, samples=schedule, sinks=[sink], sampler_cls=FakeSampler)
    record = again.loop.run(resume=True)
    assert sorted(record.samples) == list(range(1, 9)) == sorted(read_record(tmp_path).samples)
    assert sink.configs and sink.configs[0]["config"] == record.run["config"]  # the resumed session's trackers


def test_sample_rows_name_prompt_completion_reward_advantage_and_version():
    task = Task("t1", ({"role": "system", "content": "add"}, {"role": "user", "content": "2+2="}), "4", "h")
    rollouts = tuple(Rollout("t1", (1,), (5, 6), (-0.1, -0.2), text, (), version=7, reward=reward,
                             advantages=(adv, adv)) for text, reward, adv in (("4", 1.0, 0.5), ("5", 0.0, -0.5)))
    rows = sample_rows(9, [Group(task, rollouts)], limit=3)
    assert [(r["completion"], r["reward"], r["advantage"], r["version"]) for r in rows] == [
        ("4", 1.0, 0.5, 7), ("5", 0.0, -0.5, 7)]
    assert rows[0]["prompt"] == "system: add\nuser: 2+2=" == prompt_text(task.messages)
    assert prompt_text(({"role": "user", "content": "1+1="},)) == "1+1="
