"""The benchmarks' CPU share: run and run-queue seconds of the process, and the busy-machine flag."""

from __future__ import annotations

import time

import pytest

from support.bench_rig import bench_module

cpu_share = bench_module("cpu_share")


@pytest.mark.skipif(cpu_share.thread_seconds() is None, reason="no /proc/<pid>/task/*/schedstat here")
def test_a_busy_loop_counts_as_time_on_a_cpu():
    share = cpu_share.CpuShare()
    end = time.process_time() + 0.2
    while time.process_time() < end:
        pass
    report = share.report()
    assert report["ran_s"] >= 0.15
    assert report["queued_s"] >= 0.0 and 0.0 <= report["queued_share"] < 1.0


def test_the_report_flags_a_busy_machine_and_says_what_to_do():
    quiet = cpu_share.describe_share({"ran_s": 90.0, "queued_s": 1.0, "queued_share": 1.0 / 91.0})
    busy = cpu_share.describe_share({"ran_s": 30.0, "queued_s": 70.0, "queued_share": 0.7})
    assert "queued 1.0s" in quiet and "inflated" not in quiet
    assert "(70% of their runnable time)" in busy and "rerun on a quiet machine" in busy
    assert "not measured" in cpu_share.describe_share(None)


def test_no_schedstat_is_reported_as_unmeasured(monkeypatch):
    monkeypatch.setattr(cpu_share, "thread_seconds", lambda pid="self": None)
    assert cpu_share.CpuShare().report() is None
