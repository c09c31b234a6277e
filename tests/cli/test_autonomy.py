"""``rlvr autonomy``: a policy over the run queue (interval, a daily cost cap in the user's unit, the resident's
stop/start), its crontab line installed and removed through a fake ``crontab`` on PATH (never the machine's),
status, and ticks: the cap is the queue's hours budget, the resident is freed under the lock before a run
and restored however the drain ends, a tick with the policy off runs nothing, the installed line runs."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import time
from pathlib import Path

import pytest

from rlvr.cli.autonomy import MARKER, read_policy, schedule, tick
from rlvr.cli.commands import main
from rlvr.cli.queue import Queue, _today
from rlvr.errors import UsageError
from rlvr.wiring.queue_preflight import Machine

FAKE_CRONTAB = """#!/bin/sh
# crontab -l / crontab - over one file, as cron's own command does over the user's table
if [ "$1" = "-l" ]; then
  [ -f "$FAKE_CRONTAB" ] || { echo "no crontab for $(id -un)" >&2; exit 1; }
  cat "$FAKE_CRONTAB"; exit 0
fi
if [ "$1" = "-" ]; then cat > "$FAKE_CRONTAB"; exit 0; fi
echo "fake crontab: unexpected arguments $*" >&2; exit 2
"""
PLENTY = Machine(available_mb=64_000, total_mb=100_000, has_package=lambda name: True)


@pytest.fixture
def crontab(tmp_path, monkeypatch) -> Path:
    """A ``crontab`` command on PATH that keeps the table in a file; returns that file."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "crontab").write_text(FAKE_CRONTAB)
    (bin_dir / "crontab").chmod(0o755)
    table = tmp_path / "crontab.txt"
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_CRONTAB", str(table))
    return table


def test_on_prints_and_installs_the_line_off_removes_only_it_and_status_reports(tmp_path, crontab, capsys):
    crontab.write_text("0 3 * * * backup.sh\n")
    q = tmp_path / "q"
    assert main(["autonomy", "on", "--queue", str(q), "--interval-min", "30", "--cap", "5", "--cost-per-hour",
                 "0.8", "--unit", "EUR"]) == 0
    printed = capsys.readouterr().out
    line = printed.strip().splitlines()[-1]
    assert line.startswith("*/30 * * * * ") and f"autonomy tick --queue {q.resolve()}" in line
    assert line.endswith(f"{MARKER} {q.resolve()}") and "6.25 h of runs at 0.8 EUR/h" in printed
    assert crontab.read_text() == "0 3 * * * backup.sh\n"  # printed, not installed
    assert main(["autonomy", "on", "--queue", str(q), "--interval-min", "30", "--cap", "5", "--cost-per-hour",
                 "0.8", "--unit", "EUR", "--install-cron"]) == 0
    assert main(["autonomy", "on", "--queue", str(q), "--interval-min", "30", "--cap", "5", "--cost-per-hour",
                 "0.8", "--unit", "EUR", "--install-cron"]) == 0  # again: still one line
    assert crontab.read_text().splitlines() == ["0 3 * * * backup.sh", line]
    capsys.readouterr()
    assert main(["autonomy", "status", "--queue", str(q)]) == 0
    status = capsys.readouterr().out
    assert "autonomy: on" in status and "crontab line installed" in status
    assert "cap: 5 EUR/day at 0.8 EUR/h (6.25 h of runs); spent today 0.00 EUR" in status
    assert main(["autonomy", "off", "--queue", str(q)]) == 0
    assert "its crontab line removed" in capsys.readouterr().out
    assert crontab.read_text() == "0 3 * * * backup.sh\n" and read_policy(Queue(q))["enabled"] is False
    assert main(["autonomy", "status", "--queue", str(q), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["cron_installed"] is False and report["policy"]["enabled"] is False


def test_an_interval_cron_cannot_keep_and_a_half_resident_are_refused(tmp_path, crontab, capsys):
    assert schedule(15) == "*/15 * * * *" and schedule(120) == "0 */2 * * *" and schedule(1440) == "0 0 * * *"
    for minutes in (45, 0, 90):
        with pytest.raises(UsageError, match="cannot be kept by cron evenly"):
            schedule(minutes)
    assert main(["autonomy", "on", "--queue", str(tmp_path / "q"), "--interval-min", "30", "--cap", "5",
                 "--cost-per-hour", "1", "--resident-stop", "true"]) == 2
    assert "give both --resident-stop and --resident-start" in capsys.readouterr().err
    assert not (tmp_path / "q" / "autonomy.json").exists()


def _arm(q: Path, tmp_path: Path, cap: float = 1.0, per_hour: float = 0.5) -> Path:
    """A policy whose resident stop/start commands append to a file, which is returned."""
    said = tmp_path / "resident.log"
    stop = f"echo stop >> {shlex.quote(str(said))}"
    start = f"echo start >> {shlex.quote(str(said))}"
    assert main(["autonomy", "on", "--queue", str(q), "--interval-min", "10", "--cap", str(cap), "--cost-per-hour",
                 str(per_hour), "--resident-stop", stop, "--resident-start", start]) == 0
    return said


def _runs(monkeypatch, events: list[str], said: Path, fail: bool = False) -> None:
    """``run_entry`` replaced: records the resident's state when the run starts (stopped, it must be)."""
    import rlvr.cli.queue as queue_module

    def run_entry(queue, entry):
        events.append(f"run {entry['id']} with resident {said.read_text().split()[-1]}")
        if fail:
            raise RuntimeError("the run's process could not be started")
        entry.update(state="done", started_at=time.time(), finished_at=time.time(), exit_status=0)
        queue.save(entry)
        queue.spend(_today(), 1800.0)
        return 0

    monkeypatch.setattr(queue_module, "run_entry", run_entry)


def test_a_tick_frees_the_resident_runs_under_the_cap_and_restores_it(tmp_path, monkeypatch, crontab):
    q = Queue(tmp_path / "q")
    said = _arm(q.root, tmp_path)  # 1.0 a day at 0.5 an hour: 2 h of runs
    for i in range(3):
        q.add(None, str(tmp_path / f"r{i}"), [])
    events: list[str] = []
    _runs(monkeypatch, events, said)
    q.spend(_today(), 3600.0)  # 1 h already today; each run takes 0.5 h: two more fit
    lines: list[str] = []
    assert tick(q, log=lines.append, machine=PLENTY) == 0
    assert events == ["run 1 with resident stop", "run 2 with resident stop"]
    assert said.read_text().split() == ["stop", "start"]  # freed once, restored once
    assert [e["state"] for e in q.entries()] == ["done", "done", "queued"]
    assert any("budget reached: 2.00 h" in line for line in lines)
    assert read_policy(q)["last_tick"]["spent"] == pytest.approx(1.0)
    # The cap is spent: the next tick starts nothing and leaves the resident alone.
    assert tick(q, log=lines.append, machine=PLENTY) == 0
    assert len(events) == 2 and said.read_text().split() == ["stop", "start"]


def test_the_resident_is_restored_when_a_run_fails_and_not_touched_when_off(tmp_path, monkeypatch, crontab):
    q = Queue(tmp_path / "q")
    said = _arm(q.root, tmp_path, cap=10.0)
    q.add(None, str(tmp_path / "r"), [])
    events: list[str] = []
    _runs(monkeypatch, events, said, fail=True)
    with pytest.raises(RuntimeError):
        tick(q, log=lambda _line: None, machine=PLENTY)
    assert said.read_text().split() == ["stop", "start"]
    assert main(["autonomy", "off", "--queue", str(q.root)]) == 0
    assert tick(q, log=lambda _line: None, machine=PLENTY) == 0
    assert len(events) == 1 and said.read_text().split() == ["stop", "start"]


def test_the_installed_line_runs_a_tick(tmp_path, crontab):
    q = tmp_path / "q"
    assert main(["autonomy", "on", "--queue", str(q), "--interval-min", "5", "--cap", "3", "--cost-per-hour", "1",
                 "--install-cron"]) == 0
    (line,) = crontab.read_text().splitlines()
    command = line.split(" ", 5)[5]  # the five time fields off: what cron would run
    env = {**os.environ, "PYTHONPATH": os.environ.get("PYTHONPATH", str(Path(__file__).parents[2] / "src"))}
    subprocess.run(["/bin/sh", "-c", command], env=env, check=True, timeout=120)
    log = (q / "autonomy.log").read_text()
    assert "spent today 0.00 of 3 USD" in log and "nothing left to run (0 run(s) this drain)" in log
    assert read_policy(Queue(q))["last_tick"]["exit_status"] == 0
