"""The memory watchdog: levels, persistence and warn-once with an injected reader and clock; a loop
of fakes stopped by it between steps, checkpointed, and finished by a resume."""

from __future__ import annotations

import os
import subprocess
import sys

from conftest import make_rig, small_config
from rlvr.record.run_record import complete_checkpoints, read_record
from rlvr.run.watchdog import (
    MemorySample,
    MemoryWatchdog,
    OomChoice,
    WatchdogLevels,
    kernel_oom_choice,
    meminfo_mb,
    system_reader,
)
from rlvr.types import StopCause


class Script:
    """A reader returning the given available-MiB figures (of 1000 MiB total) and a clock that
    advances one second per reading."""

    def __init__(self, available: list[float], rss: float = 100.0):
        self.available, self.rss, self.t = list(available), rss, 0.0

    def read(self) -> MemorySample:
        self.t += 1.0
        return MemorySample(rss_mb=self.rss, available_mb=self.available.pop(0), total_mb=1000.0)

    def clock(self) -> float:
        return self.t


def dog(script: Script, logs: list[str], **levels: float | None) -> MemoryWatchdog:
    lv = WatchdogLevels(**{"interval_s": 0.01, "persist_s": 2.0, "warn_available_frac": 0.10,
                           "floor_available_frac": 0.05, **levels})
    return MemoryWatchdog(lv, reader=script.read, clock=script.clock, log=logs.append)


def test_a_floor_breach_trips_only_once_it_persists():
    script, logs = Script([40, 40, 40, 40]), []
    wd = dog(script, logs)
    wd.check()  # t=1: breach starts
    wd.check()  # t=2: lasted 1 s
    assert not wd.tripped
    wd.check()  # t=3: lasted 2 s = persist_s
    assert wd.tripped
    assert "available memory 40 MiB is 4.0% of 1000 MiB, under the floor of 5%" in wd.abort_reason
    assert wd.abort_details["mem/available_mb"] == 40.0 and wd.abort_details["breach_s"] == 2.0
    assert any("stopping at the next step" in line for line in logs)


def test_one_sample_above_the_floor_resets_the_persistence_clock():
    script, logs = Script([40, 40, 60, 40, 40, 40]), []
    wd = dog(script, logs)
    for _ in range(5):
        wd.check()
    assert not wd.tripped  # the breach restarted at t=4: 1 s so far
    wd.check()
    assert wd.tripped


def test_warn_is_logged_and_recorded_once_per_breach():
    script, logs = Script([80, 70, 90, 200, 80, 80]), []
    wd = dog(script, logs)
    for _ in range(6):
        wd.check()
    warnings = wd.take_warnings()
    assert len(warnings) == 2  # 80/70/90 is one breach; it cleared at 200; 80 again is a second one
    assert "under the warn level of 10%" in warnings[0]["message"] and warnings[0]["mem/available_mb"] == 80.0
    assert wd.take_warnings() == []  # each handed out once
    assert sum("memory warning" in line for line in logs) == 2
    assert not wd.tripped and wd.summary()["mem/min_available_mb"] == 70.0


def test_rss_cap_and_levels_turned_off():
    script, logs = Script([10, 10]), []
    wd = dog(script, logs, persist_s=0.0, floor_available_frac=None, warn_available_frac=None, max_rss_mb=50.0)
    wd.check()
    assert wd.tripped and "RSS 100 MiB is over the floor of 50 MiB" in str(wd.abort_reason)
    assert "available" not in str(wd.abort_reason)  # the available-memory levels are off


def test_cuda_levels_read_free_device_memory():
    wd = MemoryWatchdog(WatchdogLevels(persist_s=0.0), log=None,
                        reader=lambda: MemorySample(rss_mb=1.0, cuda_used_mb=980.0, cuda_total_mb=1000.0))
    wd.check()
    assert "accelerator free memory 20 MiB" in str(wd.abort_reason)


def test_the_system_reader_reads_this_machine():
    available, total = meminfo_mb()
    sample = system_reader(lambda: (1.0, 2.0))()
    assert sample.rss_mb and sample.rss_mb > 0
    assert available is None or 0 < sample.available_mb <= total  # type: ignore[operator]
    assert (sample.cuda_used_mb, sample.cuda_total_mb) == (1.0, 2.0)


def test_the_thread_samples_until_stopped():
    script, seen = Script([500.0] * 10_000), []
    wd = MemoryWatchdog(WatchdogLevels(interval_s=0.001), reader=script.read, clock=script.clock, log=None)
    wd.start(seen.append)
    while len(seen) < 3:
        pass
    wd.stop()
    n = wd.samples
    assert n >= 3 and wd._thread is None and wd.samples == n


class Tripped:
    """A watchdog stand-in for the loop: trips after ``n`` polls of ``tripped``."""

    def __init__(self, n: int):
        self.levels = WatchdogLevels()
        self.n, self.polls, self.last = n, 0, MemorySample(rss_mb=123.0, available_mb=7.0, total_mb=1000.0)
        self.abort_reason: str | None = None
        self.abort_details = {"source": "memory_watchdog", "mem/available_mb": 7.0}
        self.started = self.stopped = 0
        self.warnings = [{"source": "memory_watchdog", "message": "low"}]

    @property
    def tripped(self) -> bool:
        self.polls += 1
        if self.polls > self.n:
            self.abort_reason = "memory watchdog: available memory 7 MiB is 0.7% of 1000 MiB"
        return self.abort_reason is not None

    def start(self, observer) -> None:
        self.started += 1
        observer(self.last)

    def stop(self) -> None:
        self.stopped += 1

    def take_warnings(self) -> list[dict]:
        out, self.warnings = self.warnings, []
        return out

    def summary(self) -> dict:
        return {"watchdog_samples": self.polls}


def test_a_stop_right_after_a_checkpoint_is_named_by_the_resumed_event(tmp_path):
    cfg = small_config(max_steps=6, heldout_every=3)
    wd = Tripped(3)  # trips when polled after step 3, which was just evaluated and checkpointed
    make_rig(cfg, out_dir=tmp_path, watchdog=wd).loop.run()
    make_rig(cfg, out_dir=tmp_path).loop.run(resume=True)
    events = read_record(tmp_path).events
    assert not [e for e in events if str(e.kind) == "aborted"]  # rewound with what followed step 3's checkpoint
    resumed = [e for e in events if str(e.kind) == "resumed"]
    assert resumed[0].step == 3 and resumed[0].data["after_abort"]["reason"] == wd.abort_reason


def test_a_tripped_watchdog_stops_the_loop_between_steps_and_resume_finishes(tmp_path):
    cfg = small_config(max_steps=6, heldout_every=3)
    wd = Tripped(2)
    rig = make_rig(cfg, out_dir=tmp_path, watchdog=wd)
    record = rig.loop.run()
    assert wd.started == wd.stopped == 1
    assert rig.loop.stop_cause is StopCause.ABORTED and rig.loop.step == 2
    assert rig.loop.abort_reason == wd.abort_reason
    aborted = [e for e in record.events if str(e.kind) == "aborted"]
    assert aborted[0].data["reason"] == wd.abort_reason and aborted[0].data["mem/available_mb"] == 7.0
    assert [e.data["message"] for e in record.events if str(e.kind) == "warning"] == ["low"]
    assert complete_checkpoints(tmp_path)[-1].name == "step_000002"  # written at the stop
    rows = [m for m in record.metrics if "mem/sample_peak_mb" in m]
    assert len(rows) == 2 and all(m["mem/available_mb"] == 7.0 for m in rows)
    finished = record.finished.data
    assert {"mem/sample_peak_mb", "mem/train_peak_mb", "mem/heldout_peak_mb", "mem/checkpoint_peak_mb"} <= set(finished)

    again = make_rig(cfg, out_dir=tmp_path)  # no watchdog this time
    done = again.loop.run(resume=True)
    assert again.loop.stop_cause is StopCause.MAX_STEPS and again.loop.step == 6
    # Why it stopped survives the resume: the aborted event (recorded before its checkpoint) or,
    # had the stop come right after a checkpoint, the resumed event's after_abort.
    events = read_record(tmp_path).events
    reasons = [e.data["reason"] for e in events if str(e.kind) == "aborted"]
    reasons += [e.data["after_abort"]["reason"] for e in events if str(e.kind) == "resumed" and "after_abort" in e.data]
    assert reasons == [wd.abort_reason]
    assert done.finished.data["stop_cause"] == "max_steps"


# ---- the OOM killer's choice: a machine short of memory because of another job ---------------
def fake_proc(root, processes: dict[int, tuple[int, int, str]]):
    """A /proc with ``pid: (parent pid, oom_score, name)``."""
    for pid, (parent, score, name) in processes.items():
        d = root / str(pid)
        d.mkdir(parents=True)
        (d / "stat").write_text(f"{pid} ({name}) S {parent} {pid} {pid} 0 -1 4194560\n")
        (d / "oom_score").write_text(f"{score}\n")
    (root / "self").mkdir()  # not a pid: skipped
    return str(root)


def test_the_kernels_first_choice_is_read_from_proc_with_the_runs_children_counted_as_its_own(tmp_path):
    tree = {1: (0, 0, "init"), 100: (1, 50, "rlvr"), 101: (100, 300, "rlvr serve (replica 0)"),
            200: (1, 200, "other job")}
    choice = kernel_oom_choice(own_pid=100, proc=fake_proc(tmp_path / "a", tree))
    assert (choice.pid, choice.name, choice.ours) == (101, "rlvr serve (replica 0)", True)
    tree[200] = (1, 400, "other job")
    choice = kernel_oom_choice(own_pid=100, proc=fake_proc(tmp_path / "b", tree))
    assert (choice.pid, choice.ours, str(choice)) == (200, False, "pid 200 (other job)")
    tree[101] = (100, 400, "rlvr serve (replica 0)")  # a tie: the kernel's pick is not ours to predict
    assert kernel_oom_choice(own_pid=100, proc=fake_proc(tmp_path / "c", tree)).ours
    assert kernel_oom_choice(proc=str(tmp_path / "missing")) is None


def test_the_kernels_first_choice_on_this_machine_is_a_process_that_asked_to_be(tmp_path):
    first_in_line = "import time; open('/proc/self/oom_score_adj', 'w').write('1000'); b = bytearray(50 << 20); " \
                    "print('ready', flush=True); time.sleep(60)"
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    child = subprocess.Popen([sys.executable, "-c", first_in_line], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "ready"
        mine = kernel_oom_choice()  # the child is this process's
        assert (mine.pid, mine.ours) == (child.pid, True)
        theirs = kernel_oom_choice(own_pid=bystander.pid)  # the child is not the bystander's
        assert (theirs.pid, theirs.ours) == (child.pid, False)
    finally:
        for p in (child, bystander):
            p.kill()
            p.wait()


class First:
    """An ``oom_choice`` that says whose process the kernel would take first, as the test sets it."""

    def __init__(self, ours: bool):
        self.ours, self.calls = ours, 0

    def __call__(self) -> OomChoice:
        self.calls += 1
        return OomChoice(4242, "other job", self.ours) if not self.ours else OomChoice(os.getpid(), "rlvr", True)


def test_a_machine_short_of_memory_because_of_another_job_warns_and_the_run_goes_on_until_it_is_first():
    script, logs, first = Script([40, 40, 40, 40, 40, 40, 40]), [], First(ours=False)
    wd = MemoryWatchdog(WatchdogLevels(interval_s=0.01, persist_s=2.0), reader=script.read, clock=script.clock,
                        log=logs.append, oom_choice=first)
    for _ in range(4):
        wd.check()
    assert not wd.tripped and first.calls == 4
    warned = [line for line in logs if "OOM killer would stop pid 4242 (other job) first, not this run" in line]
    assert len(warned) == 1 and len(wd.take_warnings()) == 1  # once, not per sample
    first.ours = True  # the other job left or this run grew: now the kernel would take this run
    wd.check()
    wd.check()
    assert not wd.tripped  # the breach counts from when it became this run's: 1 s so far
    wd.check()
    assert wd.tripped and "available memory 40 MiB" in wd.abort_reason
    assert len(wd.take_warnings()) == 1  # the breach as this run's own is a new warning


def test_the_rss_floor_stops_the_run_whoever_the_kernel_would_take_first():
    script, logs = Script([40, 40, 40], rss=900.0), []
    wd = MemoryWatchdog(WatchdogLevels(interval_s=0.01, persist_s=1.0, max_rss_mb=500.0), reader=script.read,
                        clock=script.clock, log=logs.append, oom_choice=First(ours=False))
    wd.check()
    wd.check()
    assert wd.tripped and "RSS 900 MiB is over the floor of 500 MiB" in wd.abort_reason
    assert "available memory" not in wd.abort_reason
