"""``rlvr queue``: runs queued in a folder and drained one at a time, for unattended (overnight) use.

The queue is a folder (default ``runs/queue``): ``entries/NNNNNN.json`` per run (its config,
overrides, run folder, state ``queued`` → ``running`` → ``done`` | ``failed``, times, attempts, exit
status, log file), ``logs/NNNNNN.log`` (the run's output), ``budget.json`` (wall-clock and runs per
day) and ``lock``. Invariants:

- one drainer at a time: ``queue run`` holds ``fcntl.flock`` on ``lock`` (non-blocking: a second
  drainer exits at once, status 3, saying who holds it); ``queue add`` and ``queue ls`` need no lock;
- entries run in the order they were added, each as its own ``rlvr train`` process (``rlvr resume``
  when it is continuing), which gets SIGINT if the drainer dies, so it stops cleanly;
- a failed run is recorded (exit status, log) and the queue moves on;
- an entry a dead drainer left ``running`` is picked up by the next drainer: resumed with ``rlvr
  resume`` when its run folder has a checkpoint, else marked failed (it never reached step 0);
- the budget is checked before each run starts (a run in progress is never cut): at most
  ``--max-runs`` runs per drain and ``--max-hours-per-day`` hours of runs started that day;
- each run passes a three-way pre-flight first (:mod:`rlvr.wiring.queue_preflight`: its expected length
  fits the day's budget, its memory envelope fits the machine, the engines it needs are present);
  one that does not is deferred: left queued, the reason appended to its ``deferrals`` and shown as
  its note, and the drain moves on (the next drain checks it again). ``queue summary`` reports the
  last night (:mod:`rlvr.cli.queue_summary`).

Standard library only (the config is validated when added, through rlvr's own settings).
"""

from __future__ import annotations

import argparse
import ctypes
import fcntl
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from rlvr.errors import UsageError
from rlvr.record.run_record import complete_checkpoints

DEFAULT_QUEUE = Path("runs") / "queue"
EXIT_BUSY = 3
EXIT_STOPPED = 75  # rlvr train/resume: stopped on request (the watchdog), resumable
MAX_ATTEMPTS = 3


def _write_atomic(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True))
    os.replace(tmp, path)


class Queue:
    """The queue folder: entries, logs, budget and lock."""

    def __init__(self, root: Path):
        self.root = root
        self.entries_dir, self.logs_dir = root / "entries", root / "logs"

    def ensure(self) -> None:
        for folder in (self.entries_dir, self.logs_dir):
            folder.mkdir(parents=True, exist_ok=True)

    def entries(self) -> list[dict[str, Any]]:
        if not self.entries_dir.is_dir():
            return []
        # An entry being added is an empty file for a moment (its id claimed, its body not yet written).
        texts = (p.read_text() for p in sorted(self.entries_dir.glob("[0-9]*.json")))
        return [json.loads(text) for text in texts if text.strip()]

    def save(self, entry: dict[str, Any]) -> None:
        _write_atomic(self.entries_dir / f"{entry['id']:06d}.json", entry)

    def add(self, config: str | None, out: str | None, overrides: list[str]) -> dict[str, Any]:
        self.ensure()
        ids = [int(p.stem) for p in self.entries_dir.glob("[0-9]*.json")]
        number = max(ids, default=0) + 1
        while True:  # claim the id with O_EXCL: two concurrent adds never share one
            try:
                fd = os.open(self.entries_dir / f"{number:06d}.json", os.O_CREAT | os.O_EXCL | os.O_WRONLY)
                os.close(fd)
                break
            except FileExistsError:
                number += 1
        stem = Path(config).stem if config else "defaults"
        entry = {"id": number, "config": str(Path(config).resolve()) if config else None,
                 "overrides": overrides, "out": str(Path(out or Path("runs") / f"queue-{number:06d}-{stem}").resolve()),
                 "state": "queued", "added_at": time.time(), "started_at": None, "finished_at": None,
                 "attempts": 0, "exit_status": None, "resume": False, "note": None,
                 "log": str((self.logs_dir / f"{number:06d}.log").resolve())}
        self.save(entry)
        return entry

    # ---- the budget -----------------------------------------------------------------------
    def budget(self) -> dict[str, dict[str, float]]:
        path = self.root / "budget.json"
        return json.loads(path.read_text()) if path.exists() else {}

    def spend(self, day: str, seconds: float) -> None:
        budget = self.budget()
        today = budget.setdefault(day, {"seconds": 0.0, "runs": 0})
        today["seconds"] += seconds
        today["runs"] += 1
        _write_atomic(self.root / "budget.json", budget)


def _today(at: float | None = None) -> str:
    return time.strftime("%Y-%m-%d", time.localtime(at))


def _pid_alive(pid: int | None) -> bool:
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _die_with_parent() -> None:
    """In the child: SIGINT when the drainer dies, so a killed drainer leaves no run behind
    (the run stops as on Ctrl-C: recorded and resumable). Linux only; elsewhere a no-op."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGINT)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _resumable(out: Path) -> bool:
    return (out / "run.json").exists() and bool(complete_checkpoints(out))


def _still_running(pid: int | None, out: str) -> bool:
    """Whether ``pid`` is alive and is the run writing ``out`` (not a recycled pid)."""
    if not _pid_alive(pid):
        return False
    try:
        return out.encode() in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return True  # alive and unreadable: assume it is the run, never run one folder twice


def recover(queue: Queue, log: Any = print) -> None:
    """Entries a dead drainer left ``running`` (this drainer holds the lock, so no live one owns them)."""
    for entry in queue.entries():
        if entry["state"] != "running":
            continue
        if _still_running(entry.get("child_pid"), entry["out"]):
            log(f"rlvr queue: entry {entry['id']}: its run (pid {entry['child_pid']}) outlived its drainer and "
                "still runs; left as it is")
            continue
        out = Path(entry["out"])
        if entry["attempts"] >= MAX_ATTEMPTS:
            entry.update(state="failed", note=f"interrupted {entry['attempts']} times; giving up")
        elif _resumable(out):
            entry.update(state="queued", resume=True, note="its drainer died mid-run; resumed from its checkpoint")
        else:
            entry.update(state="failed", note="its drainer died before the run reached its first checkpoint; "
                                              "add it again")
        queue.save(entry)
        log(f"rlvr queue: entry {entry['id']} was left running by a dead drainer: {entry['state']} ({entry['note']})")


def command(entry: dict[str, Any]) -> list[str]:
    rlvr = [sys.executable, "-m", "rlvr.cli"]
    if entry["resume"]:
        return [*rlvr, "resume", entry["out"]]
    return [*rlvr, "train", *([entry["config"]] if entry["config"] else []), "--out", entry["out"],
            *entry["overrides"]]


def run_entry(queue: Queue, entry: dict[str, Any]) -> int:
    """Run one entry to its end; record its state, times and exit status."""
    started = time.time()
    entry.update(state="running", started_at=started, attempts=entry["attempts"] + 1, drainer_pid=os.getpid(),
                 exit_status=None)
    queue.save(entry)
    with open(entry["log"], "ab") as log:
        log.write(f"\n$ {' '.join(command(entry))}\n".encode())
        log.flush()
        child = subprocess.Popen(command(entry), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                 preexec_fn=_die_with_parent)  # noqa: PLW1509 - prctl only, no locks taken
        entry["child_pid"] = child.pid
        queue.save(entry)
        try:
            status = child.wait()
        except KeyboardInterrupt:
            status = child.wait()  # the run got the Ctrl-C too: it checkpoints and stops
            entry.update(state="queued", resume=_resumable(Path(entry["out"])), exit_status=status,
                         note="the drainer was interrupted; run again to continue")
            queue.save(entry)
            raise
    finished = time.time()
    queue.spend(_today(started), finished - started)
    state = "done" if status == 0 else "failed"
    note = None
    if status == EXIT_STOPPED:
        note = f"stopped on request (the memory watchdog): `rlvr resume {entry['out']}` continues it"
    elif status != 0:
        note = f"exit status {status}; see {entry['log']}"
    entry.update(state=state, finished_at=finished, exit_status=status, note=note, child_pid=None)
    queue.save(entry)
    return status


def drain(queue: Queue, max_runs: int | None, max_hours_per_day: float | None, log: Any = print,
          machine: Any = None, resident: Any = None) -> int:
    """Run queued entries one at a time within the budget, each after its pre-flight (``machine``: what
    the machine has, :class:`~rlvr.wiring.queue_preflight.Machine`, read now by default); EXIT_BUSY if
    another drainer holds the lock. ``resident`` (:class:`~rlvr.cli.autonomy.Resident`): what else holds
    the machine, freed under the lock before the first pre-flight and restored when the drain ends."""
    queue.ensure()
    lock = open(queue.root / "lock", "a+")  # noqa: SIM115 - held for the whole drain
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        lock.seek(0)
        holder = lock.read().strip() or "another process"
        log(f"rlvr queue: {queue.root} is being drained by {holder}; exiting")
        lock.close()
        return EXIT_BUSY
    try:
        lock.seek(0)
        lock.truncate()
        lock.write(f"pid {os.getpid()} since {time.strftime('%Y-%m-%d %H:%M:%S')}")
        lock.flush()
        recover(queue, log)
        ran = 0
        deferred: set[int] = set()
        while True:
            todo = [e for e in queue.entries() if e["state"] == "queued"]
            if not todo:
                log(f"rlvr queue: nothing left to run ({ran} run(s) this drain)")
                return 0
            if max_runs is not None and ran >= max_runs:
                log(f"rlvr queue: budget reached: {ran} run(s) (--max-runs {max_runs}); {len(todo)} left queued")
                return 0
            used = queue.budget().get(_today(), {}).get("seconds", 0.0)
            if max_hours_per_day is not None and used >= max_hours_per_day * 3600:
                log(f"rlvr queue: budget reached: {used / 3600:.2f} h of runs today (--max-hours-per-day "
                    f"{max_hours_per_day}); {len(todo)} left queued")
                return 0
            todo = [e for e in todo if e["id"] not in deferred]
            if not todo:
                log(f"rlvr queue: nothing left to run now ({ran} run(s) this drain, {len(deferred)} deferred)")
                return 0
            entry = todo[0]
            if resident is not None and not resident.freed:
                resident.free(log)  # before the pre-flight, so it measures the memory the runs will have
            verdict = check_entry(queue, entry, max_hours_per_day, used, machine)
            if verdict is not None and not verdict.go:
                defer(queue, entry, verdict)
                deferred.add(entry["id"])
                log(f"rlvr queue: entry {entry['id']}: deferred: {verdict.reason}")
                continue
            log(f"rlvr queue: entry {entry['id']}: {'resuming' if entry['resume'] else 'starting'} {entry['out']}")
            status = run_entry(queue, entry)
            log(f"rlvr queue: entry {entry['id']}: {'done' if status == 0 else f'failed (exit status {status})'}")
            ran += 1
    finally:
        try:
            if resident is not None and resident.freed:
                resident.restore(log)
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
            lock.close()


def check_entry(queue: Queue, entry: dict[str, Any], max_hours_per_day: float | None, used_s: float,
                machine: Any = None) -> Any:
    """The entry's pre-flight verdict (recorded in the entry); ``None`` when its config cannot be read,
    which the run itself then reports."""
    from rlvr.config.run import load_run_config, run_config_from_dict
    from rlvr.errors import RLVRError
    from rlvr.wiring.queue_preflight import Machine, earlier_runs, preflight

    out = Path(entry["out"])
    try:
        if entry["resume"]:
            saved = out / "config.json"
            cfg = run_config_from_dict(json.loads(saved.read_text()), str(saved))
        else:
            cfg = load_run_config(entry["config"], entry["overrides"])
    except (RLVRError, OSError, ValueError):
        return None
    folders = [Path(e["out"]).parent for e in queue.entries()] + [out]
    verdict = preflight(cfg, earlier_runs(folders), used_s=used_s, max_hours_per_day=max_hours_per_day,
                        machine=machine or Machine.now())
    entry["preflight"] = {"at": time.time(), **verdict.as_dict()}
    queue.save(entry)
    return verdict


def defer(queue: Queue, entry: dict[str, Any], verdict: Any) -> None:
    """Leave the entry queued, its deferral and reason recorded."""
    entry.setdefault("deferrals", []).append({"at": time.time(), "reason": verdict.reason,
                                              "checks": verdict.checks, "peak_mb": verdict.peak_mb})
    entry["note"] = f"deferred: {verdict.reason}"
    queue.save(entry)


def listing(queue: Queue) -> str:
    rows = [f"{'id':>6}  {'state':<8} {'exit':>4}  {'minutes':>7}  run folder / note"]
    for e in queue.entries():
        took = (e["finished_at"] or time.time()) - e["started_at"] if e["started_at"] else None
        exit_status = "" if e["exit_status"] is None else str(e["exit_status"])
        minutes = "" if took is None else f"{took / 60:.1f}"
        note = f"  ({e['note']})" if e["note"] else ""
        rows.append(f"{e['id']:>6}  {e['state']:<8} {exit_status:>4}  {minutes:>7}  {e['out']}{note}")
    today = queue.budget().get(_today(), {"seconds": 0.0, "runs": 0})
    rows.append(f"today: {today['runs']} run(s), {today['seconds'] / 3600:.2f} h")
    return "\n".join(rows)


def cmd_queue(args: argparse.Namespace) -> int:
    queue = Queue(Path(args.queue))
    if args.queue_command == "add":
        from rlvr.config.run import load_run_config

        if args.config is not None and not Path(args.config).is_file():
            raise UsageError(f"rlvr queue add: config {args.config} is not a file")
        load_run_config(args.config, args.overrides)  # refused now, not at 3 a.m.
        entry = queue.add(args.config, args.out, args.overrides)
        print(f"queued entry {entry['id']}: {entry['out']}")
        return 0
    if args.queue_command == "run":
        return drain(queue, args.max_runs, args.max_hours_per_day)
    if args.queue_command == "summary":
        from rlvr.cli.queue_summary import night, text

        report = night(queue.entries(), args.hours)
        print(json.dumps(report, indent=2) if args.json else text(report, queue.root))
        return 0
    if args.json:
        print(json.dumps({"entries": queue.entries(), "budget": queue.budget()}, indent=2))
    else:
        print(listing(queue))
    return 0


def add_parser(sub: Any) -> None:
    q = sub.add_parser("queue", help="queue runs and drain them one at a time: rlvr queue add|run|ls|summary")
    where = argparse.ArgumentParser(add_help=False)
    where.add_argument("--queue", default=str(DEFAULT_QUEUE), help=f"queue folder (default {DEFAULT_QUEUE})")
    qs = q.add_subparsers(dest="queue_command", required=True)
    a = qs.add_parser("add", parents=[where],
                      help="queue a run: rlvr queue add CONFIG [--out DIR] [--section.key=value ...]")
    a.add_argument("config", nargs="?", help="TOML run config (defaults when omitted)")
    a.add_argument("--out", help="run folder (default runs/queue-ID-CONFIG)")
    r = qs.add_parser("run", parents=[where], help="drain the queue, one run at a time, under a lock and a budget")
    r.add_argument("--max-runs", type=int, help="stop after this many runs")
    r.add_argument("--max-hours-per-day", type=float, help="start no run once runs started today took this long")
    ls = qs.add_parser("ls", parents=[where], help="list the queue's entries and today's budget")
    ls.add_argument("--json", action="store_true")
    sm = qs.add_parser("summary", parents=[where], help="the morning report: last night's runs, their peaks, "
                       "outcomes and deferrals")
    sm.add_argument("--hours", type=float, default=12.0, help="how far back (default 12 h)")
    sm.add_argument("--json", action="store_true")
    q.set_defaults(func=cmd_queue)
