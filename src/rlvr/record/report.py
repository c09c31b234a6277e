"""``rlvr report DIR``: the run folder as a page a person looks at, ``DIR/report/index.html``.

Made from the record files alone (run.json, events.jsonl, metrics.jsonl, selected.json), so it
works on a finished run, one still going, and one killed midway (no finished event, maybe no
selected.json, a torn last JSONL line: :func:`~rlvr.record.run_record.read_record` keeps every complete
line). The page holds a summary table and the figures of :mod:`rlvr.record.plots`; a figure the run
has no metrics for is replaced by a line saying so. Invariant: the page is rewritten whole (the
PNGs of a previous report are removed first), so it never mixes two readings of the record.
"""

from __future__ import annotations

import html
from pathlib import Path
from typing import Any

from rlvr.record.gain import change_text, observed_in_unit_interval
from rlvr.record.plots import Figure, draw_all, eval_scores, selected_step, train_eval_scores
from rlvr.record.run_record import EventKind, RunRecord, read_record

CONFIG_HIGHLIGHTS = ("max_steps", "tasks_per_step", "group_k", "lr", "temp", "kl_coef", "advantage", "lora_rank",
                     "heldout_every", "heldout_frac", "heldout_patience", "max_head_offpolicy_versions", "seed")


def summary_rows(record: RunRecord) -> list[tuple[str, str]]:
    """The summary table: (label, value) pairs, each value plain text."""
    run, rows = record.run, []
    done = record.finished
    steps = [e.step for e in record.of_kind(EventKind.STEP)]
    last = max(steps, default=0)
    failed = record.of_kind(EventKind.FAILED)
    if done:
        status = f"finished: {done.data.get('stop_cause')} at step {done.step}"
    elif failed:
        status = (f"failed at step {failed[-1].step}: {failed[-1].data.get('error')} (the traceback is in "
                  "events.jsonl)")
    else:
        status = f"not finished: stopped midway (killed) or still running; last step recorded {last}"
    rows.append(("status", status))
    warm = "; the warm-started copy it trains on is in base/" if run.get("base_folder") == "base" else ""
    rows.append(("base", f"{run.get('base') or 'tiny model built locally'}{warm}"))
    config = run.get("config", {})
    rows.append(("config", ", ".join(f"{k}={config[k]}" for k in CONFIG_HIGHLIGHTS if k in config)))
    algos = run.get("algorithms") or {}
    rows.append(("algorithm", "; ".join(f"{name or 'run'}: {a.get('type', a) if isinstance(a, dict) else a}"
                                        for name, a in algos.items()) or "-"))
    split = run.get("split", {})
    rows.append(("split", f"{split.get('n_train', '?')} training rows, {split.get('n_heldout', '?')} held-out rows"))
    held, best = record.heldout_scores, selected_step(record)
    base = held.get(0)
    train = train_eval_scores(record)
    unit = observed_in_unit_interval(record.metrics, held, record.pool_scores, train)
    if best is not None and best in held:
        gain = "" if base is None else f"; gain {change_text(base, held[best], unit)} over step 0 ({base:.3f})"
        source = "selected.json" if record.selected is not None else "the gate's best so far (no selected.json yet)"
        rows.append(("selected", f"step {best}, held-out {held[best]:.3f}{gain} — from {source}"))
    else:
        rows.append(("selected", "none yet (no held-out evaluation recorded)"))
    if train:
        last = max(s for s in train if s in held)
        rows.append(("training rows vs held-out", f"{train[last] - held[last]:+.3f} at step {last} ({train[last]:.3f} "
                     f"vs {held[last]:.3f}): as many training rows scored exactly as held-out is (greedy, same "
                     "budget); the pool score is the mean reward of temperature-sampled training completions"))
    for name, info in (run.get("eval_sets") or {}).items():
        scores = eval_scores(record).get(name, {})
        latest = f"latest {scores[max(scores)]:.3f} at step {max(scores)}" if scores else "not scored yet"
        rows.append((f"eval set {name}", f"{info.get('spec')}: {info.get('n')} rows, {info.get('in_train', 0)} also "
                     f"in the training split; {latest} (never used for selection)"))
    versions = {"rlvr": run.get("rlvr_version"), "python": run.get("python"), **(run.get("versions") or {})}
    rows.append(("versions", ", ".join(f"{k} {v}" for k, v in versions.items() if v)))
    rows.append(("config sha256", str(run.get("config_sha256", "?"))))
    return rows


def page(record: RunRecord, figures: list[Figure]) -> str:
    title = f"rlvr run: {record.path.name if record.path else 'in memory'}"
    table = "\n".join(f"<tr><th>{html.escape(k)}</th><td>{html.escape(v)}</td></tr>" for k, v in summary_rows(record))
    parts = []
    for f in figures:
        if f.file is None:
            parts.append(f'<p class="omitted" id="{f.name}"><b>{html.escape(f.title)}</b>: not drawn: '
                         f"{html.escape(f.note)}.</p>")
        else:
            parts.append(f'<figure id="{f.name}"><img src="{f.file}" alt="{html.escape(f.title)}">'
                         f"<figcaption>{html.escape(f.note)}</figcaption></figure>")
    body = "\n".join(parts)
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>
<style>
body {{ font-family: system-ui, sans-serif; max-width: 980px; margin: 1.5em auto; color: #222; }}
table {{ border-collapse: collapse; margin-bottom: 1.5em; }}
th, td {{ text-align: left; vertical-align: top; padding: 4px 10px; border-bottom: 1px solid #ddd; font-size: 14px; }}
figure {{ margin: 1.2em 0; }} img {{ max-width: 100%; }}
figcaption, .omitted {{ color: #555; font-size: 13px; }}
</style></head><body>
<h1>{html.escape(title)}</h1>
<table>
{table}
</table>
{body}
</body></html>
"""


def write_report(run_dir: str | Path) -> dict[str, Any]:
    """Write ``run_dir/report/index.html`` and its PNGs; what was written and what was omitted."""
    record = read_record(run_dir)
    folder = Path(run_dir) / "report"
    folder.mkdir(exist_ok=True)
    for old in folder.glob("*.png"):
        old.unlink()
    figures = draw_all(record, folder)
    index = folder / "index.html"
    tmp = folder / ".index.html.tmp"
    tmp.write_text(page(record, figures), encoding="utf-8")
    tmp.replace(index)
    return {"page": str(index), "plots": [str(folder / f.file) for f in figures if f.file],
            "omitted": {f.name: f.note for f in figures if f.file is None}}
