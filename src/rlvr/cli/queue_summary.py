"""``rlvr queue summary``: the morning report of a run queue (:mod:`rlvr.cli.queue`).

For the last ``--hours`` (default 12: one night), from the queue's entries and each run's own record
(:mod:`rlvr.record.history`): a headline (runs started and how they ended, the highest memory peak,
deferrals by kind), then one line per run (outcome, minutes, measured peak, held-out from step 0 to
the selected step) and one per deferred entry (each reason, the last first). Reading only: it never
changes the queue. Standard library only.
"""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path
from typing import Any

from rlvr.errors import RecordError
from rlvr.record.history import RunSummary, run_summary


def _record(entry: dict[str, Any]) -> RunSummary | None:
    try:
        return run_summary(entry["out"])
    except (RecordError, OSError, ValueError, KeyError, TypeError):
        return None  # the run never wrote its run.json (it failed before step 0)


def night(entries: list[dict[str, Any]], hours: float, now: float | None = None) -> dict[str, Any]:
    """The runs started and the entries deferred within the last ``hours``, with their figures."""
    since = (now if now is not None else time.time()) - hours * 3600
    ran, deferred = [], []
    for e in entries:
        if e.get("started_at") and e["started_at"] >= since:
            record = _record(e)
            ran.append({"id": e["id"], "state": e["state"], "out": e["out"], "exit_status": e.get("exit_status"),
                        "minutes": ((e.get("finished_at") or time.time()) - e["started_at"]) / 60,
                        "peak_mb": record.peak_mb if record else None,
                        "expected_peak_mb": (e.get("preflight") or {}).get("peak_mb"),
                        "status": record.status if record else None, "steps": record.steps if record else None,
                        "baseline_heldout": record.baseline_heldout if record else None,
                        "selected_step": record.selected_step if record else None,
                        "selected_heldout": record.selected_heldout if record else None, "note": e.get("note")})
        recent = [d for d in e.get("deferrals", []) if d["at"] >= since]
        if recent and e["state"] == "queued":
            deferred.append({"id": e["id"], "out": e["out"], "times": len(recent),
                             "reasons": [d["reason"] for d in reversed(recent)]})
    return {"since": since, "hours": hours, "ran": ran, "deferred": deferred}


def _kinds(deferred: list[dict[str, Any]]) -> Counter:
    """Deferrals by the check that caused them (budget, memory, engines), each entry's last reason."""
    kinds: Counter = Counter()
    for d in deferred:
        for part in d["reasons"][0].split("; "):
            kinds[part.split(":", 1)[0]] += 1
    return kinds


def text(report: dict[str, Any], queue_root: Path) -> str:
    ran, deferred = report["ran"], report["deferred"]
    ends = Counter(r["state"] for r in ran)
    peaks = [(r["peak_mb"], r["id"]) for r in ran if r["peak_mb"] is not None]
    head = [f"queue {queue_root}, last {report['hours']:g} h: ran {len(ran)}"
            + (f" ({', '.join(f'{n} {s}' for s, n in sorted(ends.items()))})" if ran else "")]
    if peaks:
        peak, at = max(peaks)
        head.append(f"peak {peak:.0f} MB (entry {at})")
    kinds = _kinds(deferred)
    head.append(f"{len(deferred)} deferred" + (f" ({', '.join(f'{n} {k}' for k, n in sorted(kinds.items()))})"
                                               if kinds else ""))
    lines = [" · ".join(head)]
    for r in ran:
        peak = f"peak {r['peak_mb']:.0f} MB" if r["peak_mb"] is not None else (
            f"peak ? (expected ~{r['expected_peak_mb']:.0f} MB)" if r["expected_peak_mb"] else "peak ?")
        outcome = r["status"] or r["state"]
        if r["selected_heldout"] is not None:
            base = r["baseline_heldout"]
            outcome += (f", held-out {base:.3f} → {r['selected_heldout']:.3f}" if base is not None
                        else f", held-out {r['selected_heldout']:.3f}") + f" (step {r['selected_step']})"
        if r["state"] == "failed":
            outcome += f"; {r['note']}" if r["note"] else f"; exit status {r['exit_status']}"
        lines.append(f"  #{r['id']} {r['state']:<8} {r['minutes']:6.1f} min  {peak:<14} {outcome}  {r['out']}")
    for d in deferred:
        times = f" ({d['times']} times)" if d["times"] > 1 else ""
        lines.append(f"  #{d['id']} deferred{times}: {d['reasons'][0]}  {d['out']}")
    return "\n".join(lines)
