"""``rlvr autonomy``: the run queue drained on a schedule, under a daily cost cap, with nobody at the machine.

``autonomy on`` records a policy in the queue folder (``autonomy.json``: the interval, the cap per day
in the user's own unit and what one hour of runs costs in it, the resident's stop/start commands) and
prints the crontab line that runs ``rlvr autonomy tick`` every interval; ``--install-cron`` adds it to
the user's crontab (through the ``crontab`` command). ``autonomy off`` marks the policy off and removes
that line; ``autonomy status`` reports both, today's spend and the last tick. Invariants:

- a tick is one :func:`rlvr.cli.queue.drain`: the queue's lock (a second tick while a drain runs exits
  at once), its order, its recovery and its pre-flight hold unchanged; the cap is the queue's hours
  budget, ``cap / cost_per_hour`` hours of runs started per day, so the spend is what the queue already
  records (``budget.json``), and a run in progress is never cut (the pre-flight defers one whose
  expected length does not fit what is left);
- the resident (a chat model server that holds the machine between runs, named by its stop and start
  commands) is stopped under the lock, only when an entry is about to be checked, and started again
  when the drain ends, however it ends; a stop command that fails means nothing was resident, and
  nothing is started afterwards;
- a tick with the policy off, or no policy, runs nothing;
- the crontab line carries a marker naming the queue folder, so ``off`` removes this queue's line and
  no other.

Standard library only.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlvr.cli.queue import DEFAULT_QUEUE, Queue, _today, _write_atomic, drain
from rlvr.errors import UsageError

POLICY_FILE = "autonomy.json"
MARKER = "# rlvr autonomy:"
COMMAND_TIMEOUT_S = 600.0  # a resident's stop or start (a server unloading or loading a model)


@dataclass
class Resident:
    """What holds the machine between runs, as its stop and start commands (shell command lines)."""

    stop: str | None
    start: str | None
    freed: bool = False

    def free(self, log: Any) -> None:
        if not self.stop:
            return
        status = _shell(self.stop, log, "stop")
        self.freed = status == 0
        if not self.freed:
            log(f"rlvr autonomy: the resident's stop command exited {status}: taken as nothing resident, so "
                "nothing is started after the drain")

    def restore(self, log: Any) -> None:
        self.freed = False
        if self.start:
            status = _shell(self.start, log, "start")
            if status != 0:
                log(f"rlvr autonomy: the resident's start command exited {status}: it is not running now")


def _shell(command: str, log: Any, what: str) -> int:
    log(f"rlvr autonomy: resident {what}: {command}")
    try:
        return subprocess.run(command, shell=True, timeout=COMMAND_TIMEOUT_S, stdin=subprocess.DEVNULL,
                              check=False).returncode
    except subprocess.TimeoutExpired:
        log(f"rlvr autonomy: the resident's {what} command did not finish in {COMMAND_TIMEOUT_S:.0f} s")
        return 124


def schedule(interval_min: int) -> str:
    """The crontab time fields that fire every ``interval_min`` minutes, evenly through the day."""
    if 1 <= interval_min < 60 and 60 % interval_min == 0:
        return f"*/{interval_min} * * * *" if interval_min > 1 else "* * * * *"
    if interval_min >= 60 and interval_min % 60 == 0 and 24 % (interval_min // 60) == 0:
        hours = interval_min // 60
        return f"0 */{hours} * * *" if hours < 24 else "0 0 * * *"
    raise UsageError(f"rlvr autonomy on: --interval-min {interval_min} cannot be kept by cron evenly; give a "
                     "divisor of 60 (1, 2, 3, 4, 5, 6, 10, 12, 15, 20, 30) or of 1440 in whole hours "
                     "(60, 120, 180, 240, 360, 480, 720, 1440)")


def cron_line(queue: Path, interval_min: int) -> str:
    """The crontab line a policy installs: a tick every interval, its output appended to the queue's log."""
    root = queue.resolve()
    env = f"PYTHONPATH={shlex.quote(os.environ['PYTHONPATH'])} " if os.environ.get("PYTHONPATH") else ""
    tick = (f"cd {shlex.quote(str(Path.cwd()))} && {env}{shlex.quote(sys.executable)} -m rlvr.cli autonomy tick "
            f"--queue {shlex.quote(str(root))} >> {shlex.quote(str(root / 'autonomy.log'))} 2>&1")
    return f"{schedule(interval_min)} {tick} {MARKER} {root}"


# ---- the crontab ------------------------------------------------------------------------------
def _crontab_lines() -> list[str]:
    try:
        listed = subprocess.run(["crontab", "-l"], capture_output=True, text=True, timeout=30, check=False)
    except FileNotFoundError:
        raise UsageError("rlvr autonomy: no crontab command on this machine; add the printed line to the "
                         "scheduler you use instead") from None
    if listed.returncode != 0:
        if "no crontab" in listed.stderr.lower():
            return []
        raise UsageError(f"rlvr autonomy: `crontab -l` failed: {listed.stderr.strip()}")
    return listed.stdout.splitlines()


def _write_crontab(lines: list[str]) -> None:
    text = "".join(f"{line}\n" for line in lines)
    written = subprocess.run(["crontab", "-"], input=text, capture_output=True, text=True, timeout=30, check=False)
    if written.returncode != 0:
        raise UsageError(f"rlvr autonomy: `crontab -` refused the new table: {written.stderr.strip()}")


def _ours(line: str, queue: Path) -> bool:
    return line.rstrip().endswith(f"{MARKER} {queue.resolve()}")


def install_cron(queue: Path, line: str) -> None:
    _write_crontab([*(x for x in _crontab_lines() if not _ours(x, queue)), line])


def remove_cron(queue: Path) -> bool:
    lines = _crontab_lines()
    kept = [x for x in lines if not _ours(x, queue)]
    if len(kept) != len(lines):
        _write_crontab(kept)
    return len(kept) != len(lines)


def cron_installed(queue: Path) -> bool | None:
    """Whether this queue's line is in the crontab (``None``: the crontab cannot be read here)."""
    try:
        return any(_ours(x, queue) for x in _crontab_lines())
    except UsageError:
        return None


# ---- the policy -------------------------------------------------------------------------------
def read_policy(queue: Queue) -> dict[str, Any] | None:
    path = queue.root / POLICY_FILE
    return json.loads(path.read_text()) if path.exists() else None


def hours_per_day(policy: dict[str, Any]) -> float:
    return float(policy["cap"]) / float(policy["cost_per_hour"])


def spent_today(queue: Queue, policy: dict[str, Any]) -> float:
    seconds = queue.budget().get(_today(), {}).get("seconds", 0.0)
    return seconds / 3600 * float(policy["cost_per_hour"])


def turn_on(queue: Queue, args: argparse.Namespace) -> dict[str, Any]:
    if not args.cap > 0 or not args.cost_per_hour > 0:
        raise UsageError("rlvr autonomy on: --cap and --cost-per-hour must be above 0")
    if bool(args.resident_stop) != bool(args.resident_start):
        raise UsageError("rlvr autonomy on: give both --resident-stop and --resident-start (what is stopped is "
                         "started again when the drain ends), or neither")
    line = cron_line(queue.root, args.interval_min)  # an interval cron cannot keep is refused before recording
    queue.ensure()
    policy = {"enabled": True, "interval_min": args.interval_min, "cap": args.cap, "unit": args.unit,
              "cost_per_hour": args.cost_per_hour, "max_runs": args.max_runs, "resident_stop": args.resident_stop,
              "resident_start": args.resident_start, "cron_line": line, "armed_at": time.time(),
              "last_tick": (read_policy(queue) or {}).get("last_tick")}
    _write_atomic(queue.root / POLICY_FILE, policy)
    if args.install_cron:
        install_cron(queue.root, line)
    return policy


def tick(queue: Queue, log: Any = print, machine: Any = None) -> int:
    """One scheduled drain under the policy (see the module doc); 0 when there was nothing to do."""
    policy = read_policy(queue)
    if policy is None or not policy.get("enabled"):
        log(f"rlvr autonomy: off for {queue.root}; nothing run")
        return 0
    unit, cap = policy["unit"], float(policy["cap"])
    hours = hours_per_day(policy)
    log(f"rlvr autonomy: tick at {time.strftime('%Y-%m-%d %H:%M:%S')}: spent today {spent_today(queue, policy):.2f}"
        f" of {cap:g} {unit} ({hours:.2f} h of runs at {float(policy['cost_per_hour']):g} {unit}/h)")
    resident = Resident(policy.get("resident_stop"), policy.get("resident_start"))
    status = drain(queue, policy.get("max_runs"), hours, log=log, machine=machine, resident=resident)
    policy = read_policy(queue) or policy  # `off` may have run meanwhile: keep what it wrote
    policy["last_tick"] = {"at": time.time(), "exit_status": status, "spent": round(spent_today(queue, policy), 4)}
    _write_atomic(queue.root / POLICY_FILE, policy)
    return status


def turn_off(queue: Queue) -> tuple[bool, bool | None]:
    """``(whether a policy was on, whether a crontab line was removed; None: no crontab here)``."""
    policy = read_policy(queue)
    was_on = bool(policy and policy.get("enabled"))
    if policy is not None:
        _write_atomic(queue.root / POLICY_FILE, {**policy, "enabled": False, "disarmed_at": time.time()})
    try:
        removed: bool | None = remove_cron(queue.root)
    except UsageError:
        removed = None
    return was_on, removed


def status(queue: Queue) -> dict[str, Any]:
    """The policy, whether its line is installed, today's spend, the queue and who holds its lock."""
    policy = read_policy(queue)
    lock = queue.root / "lock"
    holder = lock.read_text().strip() if lock.exists() else ""
    out: dict[str, Any] = {"queue": str(queue.root.resolve()), "policy": policy, "cron_installed": cron_installed(
        queue.root), "queued": sum(e["state"] == "queued" for e in queue.entries()),
        "running": sum(e["state"] == "running" for e in queue.entries()), "lock": holder or None}
    if policy is not None:
        out["spent_today"] = round(spent_today(queue, policy), 4)
        out["hours_per_day"] = round(hours_per_day(policy), 4)
    return out


def status_text(report: dict[str, Any]) -> str:
    policy = report["policy"]
    if policy is None:
        return f"autonomy: never turned on for {report['queue']} (rlvr autonomy on --interval-min 30 --cap 5 ...)"
    unit = policy["unit"]
    installed = {True: "installed", False: "not installed", None: "unknown (no crontab here)"}[report["cron_installed"]]
    lines = [f"autonomy: {'on' if policy['enabled'] else 'off'} for {report['queue']}",
             f"every {policy['interval_min']} min; crontab line {installed}",
             f"cap: {policy['cap']:g} {unit}/day at {policy['cost_per_hour']:g} {unit}/h "
             f"({report['hours_per_day']:.2f} h of runs); spent today {report['spent_today']:.2f} {unit}",
             f"queue: {report['queued']} queued, {report['running']} running"
             + (f"; lock last held by {report['lock']}" if report["lock"] else "")]
    if policy.get("resident_stop"):
        lines.append(f"resident: stopped by `{policy['resident_stop']}`, started again by `{policy['resident_start']}`")
    last = policy.get("last_tick")
    if last:
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(last["at"]))
        lines.append(f"last tick: {when}, exit status {last['exit_status']}, spent then {last['spent']:.2f} {unit}")
    else:
        lines.append("last tick: none yet")
    return "\n".join(lines)


def cmd_autonomy(args: argparse.Namespace) -> int:
    queue = Queue(Path(args.queue))
    if args.autonomy_command == "on":
        policy = turn_on(queue, args)
        print(f"autonomy on for {queue.root}: every {policy['interval_min']} min, at most {policy['cap']:g} "
              f"{policy['unit']}/day ({hours_per_day(policy):.2f} h of runs at {policy['cost_per_hour']:g} "
              f"{policy['unit']}/h)")
        print("crontab line" + (" (installed):" if args.install_cron else " (add it with `crontab -e`, or run "
                                "again with --install-cron):"))
        print(policy["cron_line"])
        return 0
    if args.autonomy_command == "off":
        was_on, removed = turn_off(queue)
        cron = {True: "its crontab line removed", False: "no crontab line was installed",
                None: "no crontab here to remove a line from"}[removed]
        print(f"autonomy off for {queue.root} ({'it was on' if was_on else 'it was not on'}; {cron}); a drain "
              "running now finishes its run")
        return 0
    if args.autonomy_command == "tick":
        return tick(queue)
    report = status(queue)
    print(json.dumps(report, indent=2) if args.json else status_text(report))
    return 0


def add_parser(sub: Any) -> None:
    a = sub.add_parser("autonomy", help="drain the run queue on a schedule under a daily cost cap: "
                       "rlvr autonomy on|off|status|tick")
    where = argparse.ArgumentParser(add_help=False)
    where.add_argument("--queue", default=str(DEFAULT_QUEUE), help=f"queue folder (default {DEFAULT_QUEUE})")
    subs = a.add_subparsers(dest="autonomy_command", required=True)
    on = subs.add_parser("on", parents=[where], help="record the policy and print (or install) its crontab line")
    on.add_argument("--interval-min", type=int, required=True, help="minutes between ticks (a divisor of 60, or "
                    "whole hours dividing a day)")
    on.add_argument("--cap", type=float, required=True, help="the most runs may cost per day, in --unit")
    on.add_argument("--cost-per-hour", type=float, required=True, help="what one hour of runs costs, in --unit "
                    "(the machine's hourly price, or its power at your tariff)")
    on.add_argument("--unit", default="USD", help="the unit the cap and the cost are in (default USD)")
    on.add_argument("--max-runs", type=int, help="start at most this many runs per tick")
    on.add_argument("--resident-stop", help="shell command that frees the machine before runs (e.g. stops a chat "
                    "model server)")
    on.add_argument("--resident-start", help="shell command that brings it back when the drain ends")
    on.add_argument("--install-cron", action="store_true", help="add the line to your crontab")
    subs.add_parser("off", parents=[where], help="turn it off and remove its crontab line")
    st = subs.add_parser("status", parents=[where], help="the policy, its crontab line, today's spend, last tick")
    st.add_argument("--json", action="store_true")
    subs.add_parser("tick", parents=[where], help="one scheduled drain under the policy (what cron runs)")
    a.set_defaults(func=cmd_autonomy)
