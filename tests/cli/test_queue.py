"""The run queue's bookkeeping without training: ids, the lock, the budget, recovery after a dead drainer,
the three-way pre-flight (deferrals with their reasons) and the morning summary."""

from __future__ import annotations

import dataclasses
import fcntl
import json
import time

import pytest

from rlvr.cli.queue import EXIT_BUSY, Queue, _today, drain, recover
from rlvr.record.run_record import STATE_FILE


def test_entries_get_increasing_ids_and_are_listed_in_order(tmp_path):
    q = Queue(tmp_path / "q")
    ids = [q.add(None, str(tmp_path / f"r{i}"), [f"--loop.seed={i}"])["id"] for i in range(3)]
    assert ids == [1, 2, 3]
    assert [e["overrides"] for e in q.entries()] == [["--loop.seed=0"], ["--loop.seed=1"], ["--loop.seed=2"]]
    assert all(e["state"] == "queued" for e in q.entries())


def test_a_second_drainer_exits_at_once(tmp_path):
    q = Queue(tmp_path / "q")
    q.ensure()
    with open(q.root / "lock", "a+") as held:
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        held.write("pid 1 since now")
        held.flush()
        said = []
        assert drain(q, None, None, log=said.append) == EXIT_BUSY
    assert "being drained by pid 1" in said[0]


def test_the_budget_stops_the_drain_before_a_run_starts(tmp_path):
    q = Queue(tmp_path / "q")
    q.add(None, str(tmp_path / "r"), [])
    q.spend(_today(), 7200.0)
    said = []
    assert drain(q, None, 2.0, log=said.append) == 0
    assert "budget reached: 2.00 h" in said[-1] and q.entries()[0]["state"] == "queued"


def test_an_entry_left_running_by_a_dead_drainer_is_resumed_or_failed(tmp_path):
    q = Queue(tmp_path / "q")
    with_ckpt, without = tmp_path / "a", tmp_path / "b"
    (with_ckpt / "checkpoints" / "step_000002").mkdir(parents=True)
    (with_ckpt / "checkpoints" / "step_000002" / STATE_FILE).write_text("{}")
    (with_ckpt / "run.json").write_text("{}")
    without.mkdir()
    for out in (with_ckpt, without):
        entry = q.add(None, str(out), [])
        entry.update(state="running", attempts=1, child_pid=2**22 + 7, drainer_pid=2**22 + 8)
        q.save(entry)
    recover(q, log=lambda _m: None)
    first, second = q.entries()
    assert (first["state"], first["resume"]) == ("queued", True)
    assert second["state"] == "failed" and "first checkpoint" in second["note"]
    assert json.loads((q.entries_dir / "000001.json").read_text())["resume"] is True


# ---- the pre-flight and the morning summary -------------------------------------------------------
def _fake_runs(monkeypatch, ran: list[int]) -> None:
    """``run_entry`` replaced: records the entry and marks it done without training."""
    import rlvr.cli.queue as queue_module

    def run_entry(queue, entry):
        ran.append(entry["id"])
        entry.update(state="done", started_at=time.time(), finished_at=time.time(), exit_status=0)
        queue.save(entry)
        return 0

    monkeypatch.setattr(queue_module, "run_entry", run_entry)


def test_an_entry_missing_an_engine_or_memory_is_deferred_with_its_reason_and_the_rest_run(tmp_path, monkeypatch):
    from rlvr.wiring.queue_preflight import Machine

    q = Queue(tmp_path / "q")
    q.add(None, str(tmp_path / "on-ray"), ["--cluster.backend=ray"])
    q.add(None, str(tmp_path / "fits"), [])
    ran: list[int] = []
    _fake_runs(monkeypatch, ran)
    no_ray = Machine(available_mb=64_000, total_mb=100_000, has_package=lambda name: name != "ray")
    said: list[str] = []
    assert drain(q, None, None, log=said.append, machine=no_ray) == 0
    first, second = q.entries()
    assert ran == [2] and first["state"] == "queued" and second["state"] == "done"
    (deferral,) = first["deferrals"]
    assert deferral["reason"] == "engines: missing ray (for cluster.backend = 'ray')"
    assert first["note"] == "deferred: engines: missing ray (for cluster.backend = 'ray')"
    assert "rlvr queue: entry 1: deferred: engines: missing ray" in said[0]
    assert second["preflight"]["go"] and second["preflight"]["peak_basis"] == "estimated from the model's size"
    # A machine short of memory: the tiny model's estimate (~1.1 GB) does not fit 500 MB less the 5% floor.
    small = Machine(available_mb=500, total_mb=8_000, has_package=lambda name: True)
    assert drain(q, None, None, log=said.append, machine=small) == 0
    first = q.entries()[0]
    assert len(first["deferrals"]) == 2 and first["deferrals"][1]["reason"].startswith(
        "memory: the run needs ~1") and "but 100 MB are free beyond the watchdog's floor" in first["note"]
    # Enough of both: it runs.
    enough = Machine(available_mb=64_000, total_mb=100_000, has_package=lambda name: True)
    assert drain(q, None, None, log=said.append, machine=enough) == 0
    assert ran == [2, 1] and q.entries()[0]["state"] == "done"


def test_colocated_vllm_needs_vllm_in_rlvrs_own_python_and_counts_the_engines_copy():
    from rlvr.config.run import run_config_from_dict
    from rlvr.wiring.queue_preflight import (
        DTYPE_BYTES,
        MARGIN,
        MB,
        Machine,
        engines_check,
        estimate_peak_mb,
        model_params,
    )

    local = run_config_from_dict({"model": {"tiny": True}})
    colocated = run_config_from_dict({"model": {"tiny": True}, "sampler": {"backend": "vllm_colocate"}})
    without = Machine(available_mb=64_000, total_mb=100_000, has_package=lambda name: name != "vllm")
    reason, _ = engines_check(colocated, without)
    assert reason == ("engines: missing vllm (for sampler.backend = 'vllm_colocate': inside this Python, the one "
                      "rlvr runs from)")
    assert engines_check(local, without)[0] is None
    assert engines_check(colocated, Machine(64_000, 100_000, has_package=lambda name: True))[1].endswith("vllm")
    # One more copy of the weights, W = parameters x dtype bytes, with the margin on top.
    weights_mb = model_params(local) * DTYPE_BYTES[local.model.dtype] / MB
    assert weights_mb > 0
    assert estimate_peak_mb(colocated) - estimate_peak_mb(local) == pytest.approx(weights_mb * MARGIN)


def test_the_morning_summary_names_runs_peaks_outcomes_and_deferrals(tmp_path):
    from conftest import make_rig, small_config
    from rlvr.cli.queue_summary import night, text

    q = Queue(tmp_path / "q")
    done = q.add(None, str(tmp_path / "good"), [])
    make_rig(small_config(), out_dir=tmp_path / "good").loop.run()
    failed = q.add(None, str(tmp_path / "bad"), [])
    waiting = q.add(None, str(tmp_path / "later"), [])
    now = time.time()
    done.update(state="done", started_at=now - 3000, finished_at=now - 2400, exit_status=0)
    failed.update(state="failed", started_at=now - 2000, finished_at=now - 1940, exit_status=2,
                  note="exit status 2; see the log", preflight={"peak_mb": 1200.0})
    waiting["deferrals"] = [{"at": now - 100, "reason": "memory: the run needs ~9000 MB (estimated) but 500 MB are "
                             "free beyond the watchdog's floor", "checks": {}, "peak_mb": 9000.0}]
    old = q.add(None, str(tmp_path / "old"), [])
    old.update(state="done", started_at=now - 90_000, finished_at=now - 89_000, exit_status=0)
    for entry in (done, failed, waiting, old):
        q.save(entry)
    report = night(q.entries(), hours=12, now=now)
    assert [r["id"] for r in report["ran"]] == [1, 2] and [d["id"] for d in report["deferred"]] == [3]
    peak = report["ran"][0]["peak_mb"]
    assert peak is not None and peak > 0  # measured by the run itself (mem/process_peak_mb)
    lines = text(report, q.root).splitlines()
    assert lines[0] == f"queue {q.root}, last 12 h: ran 2 (1 done, 1 failed) · peak {peak:.0f} MB (entry 1) · " \
                       "1 deferred (1 memory)"
    assert "finished (max_steps), held-out 0.100 → 0.180 (step 8)" in lines[1] and "10.0 min" in lines[1]
    assert "peak ? (expected ~1200 MB)" in lines[2] and "exit status 2; see the log" in lines[2]
    assert lines[3].startswith("  #3 deferred: memory: the run needs ~9000 MB")


def test_the_memory_envelope_borrows_a_measured_peak_only_from_a_run_whose_sampler_ran_in_the_same_place(tmp_path):
    from pathlib import Path

    from rlvr.config.run import run_config_from_dict
    from rlvr.record.history import RunSummary, base_of, sampler_placement
    from rlvr.wiring.queue_preflight import Machine, estimate_peak_mb, preflight

    def cfg(**sampler):
        return run_config_from_dict({"model": {"tiny": True}, "sampler": sampler})

    def earlier(name, config, peak, created_at):
        dumped = config.model_dump(mode="json")
        return RunSummary(path=Path(name), status="finished (max_steps)", base=base_of(dumped), steps=3,
                          best_heldout=None, selected_step=None, selected_heldout=None, baseline_heldout=None,
                          config=dumped, created_at=created_at, ended_at=created_at + 60, peak_mb=peak)

    machine = Machine(available_mb=64_000, total_mb=100_000, has_package=lambda name: True)
    in_process, colocated = cfg(backend="in_process"), cfg(backend="vllm_colocate")
    runs = [earlier("in-process-run", in_process, 628.0, 1.0)]
    # Only an in-process run measured: a colocated entry falls back to the estimate, not its 628 MB.
    verdict = preflight(colocated, runs, used_s=0.0, max_hours_per_day=None, machine=machine)
    assert verdict.peak_basis == "estimated from the model's size"
    assert verdict.peak_mb == pytest.approx(estimate_peak_mb(colocated))
    assert preflight(in_process, runs, used_s=0.0, max_hours_per_day=None, machine=machine).peak_mb == 628.0
    # Once a colocated run measured its peak, a colocated entry borrows that one.
    runs.append(earlier("colocated-run", colocated, 2053.0, 2.0))
    verdict = preflight(colocated, runs, used_s=0.0, max_hours_per_day=None, machine=machine)
    assert (verdict.peak_mb, verdict.peak_basis) == (2053.0, "measured in colocated-run")
    # A server rlvr starts and one at a URL hold different shares of the memory: neither borrows the other's.
    started, remote = cfg(backend="http"), cfg(backend="http", url="http://127.0.0.1:9/v1")
    runs.append(earlier("remote-run", remote, 700.0, 3.0))
    assert preflight(started, runs, used_s=0.0, max_hours_per_day=None,
                     machine=machine).peak_basis == "estimated from the model's size"
    assert preflight(remote, runs, used_s=0.0, max_hours_per_day=None, machine=machine).peak_mb == 700.0
    # A record that does not say where its sampler ran lends no peak.
    unsaid = {k: v for k, v in runs[0].config.items() if k != "sampler"}
    legacy = dataclasses.replace(runs[0], config=unsaid, path=Path("legacy"))
    assert base_of(unsaid) == runs[0].base
    assert sampler_placement(legacy.config) is None
    assert preflight(in_process, [legacy], used_s=0.0, max_hours_per_day=None,
                     machine=machine).peak_basis == "estimated from the model's size"
    assert [sampler_placement(c.model_dump(mode="json")) for c in (in_process, colocated, started, remote)] == [
        "in_process/in-process", "vllm_colocate/colocated", "http/server", "http/remote"]


def test_an_sglang_server_rlvr_would_start_needs_sglangs_python(monkeypatch):
    from rlvr.config.run import run_config_from_dict
    from rlvr.wiring.queue_preflight import Machine, engines_check

    monkeypatch.delenv("RLVR_SGLANG_PYTHON", raising=False)
    machine = Machine(available_mb=64_000, total_mb=100_000, has_package=lambda name: True)
    started = run_config_from_dict({"model": {"tiny": True}, "sampler": {"backend": "sglang"}})
    reason, _ = engines_check(started, machine)
    assert reason.startswith("engines: missing SGLang (for sampler.backend = 'sglang': ") and "sglang_python" in reason
    attached = run_config_from_dict({"model": {"tiny": True}, "sampler": {"backend": "sglang",
                                                                          "url": "http://10.0.0.5:30000"}})
    assert engines_check(attached, machine)[0] is None  # a server someone else runs
