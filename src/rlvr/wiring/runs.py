"""``rlvr runs [ROOT]`` and "has this been tried": earlier runs, compared from their records.

- :func:`say_earlier_tries`, called before a new run writes anything: the runs under the runs root
  (``log.runs_root``, default the folder holding the run folder) with the same base, data and split,
  and what each reached; an identical one (same resolved config but for run-only keys,
  :data:`rlvr.record.history.RUN_ONLY`) is said first. It never refuses: trying again is allowed.
- :func:`cmd_runs`: every run under ROOT as a table (run, status, base, steps, best held-out, selected
  step and its score) with each run's config differences against a chosen one (``--vs``, default
  the newest), or as JSON.

Part of the composition root; standard library only (the records are read by :mod:`rlvr.record.history`).
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from rlvr.errors import UsageError
from rlvr.record.history import RunSummary, Try, config_differences, difference_text, earlier_tries, find_runs

SHOWN = 5  # earlier runs named before a run starts; the rest are counted


def runs_root(run_dir: Path, configured: str | None) -> Path:
    return Path(configured) if configured else run_dir.resolve().parent


def say_earlier_tries(config: Mapping[str, Any], split: Mapping[str, Any], run_dir: Path, *, root: Path,
                      base_sha256: str | None = None, log: Callable[[str], None] = print) -> list[Try]:
    """Look up and print the earlier runs like this one (see the module docstring); returns them."""
    tries = earlier_tries(find_runs(root), config, split, base_sha256, exclude=run_dir)
    where = _shown_path(root)
    if not tries:
        log(f"has this been tried: no earlier run under {where} with this base, data and split")
        return tries
    same = sum(t.identical for t in tries)
    log(f"has this been tried: {len(tries)} earlier run(s) under {where} with this base, data and split "
        f"({same} with this very config)")
    for t in tries[:SHOWN]:
        config_said = "the same config" if t.identical else f"differs in {difference_text(t.differences)}"
        log(f"  {_shown_path(t.run.path)}: {config_said}; {t.run.reached()}")
    if len(tries) > SHOWN:
        log(f"  and {len(tries) - SHOWN} more (rlvr runs {where})")
    return tries


def before_start(cfg: Any, split: Any, run_dir: Path, log: Callable[[str], None] = print) -> list[Try]:
    """For ``rlvr train`` (a :class:`~rlvr.config.run.RunConfig` and its carved split): say the earlier tries."""
    base_sha256 = None
    if cfg.model.base is not None:
        from rlvr.backends.model.sources import gguf_path, is_gguf
        from rlvr.seeding import file_sha256

        if is_gguf(cfg.model.base):
            base_sha256 = file_sha256(gguf_path(cfg.model.base))
    return say_earlier_tries(cfg.model_dump(mode="json"), split.manifest, run_dir,
                             root=runs_root(run_dir, cfg.log.runs_root), base_sha256=base_sha256, log=log)


def _shown_path(path: Path) -> str:
    """Relative to the working folder when under it, else as it is."""
    try:
        relative = os.path.relpath(path)
    except ValueError:  # another drive
        return str(path)
    return str(path) if relative.startswith("..") else relative


# ---- rlvr runs ------------------------------------------------------------------------------
def _score(value: float | None) -> str:
    return "" if value is None else f"{value:.3f}"


def _reference(runs: list[RunSummary], chosen: str | None, root: Path) -> RunSummary:
    if chosen is None:
        return max(runs, key=lambda r: r.created_at or 0.0)
    wanted = Path(chosen)
    for run in runs:
        if run.path.resolve() in ((root / wanted).resolve(), wanted.resolve()) or run.path.name == chosen:
            return run
    raise UsageError(f"rlvr runs --vs {chosen}: no run of that name under {root} "
                     f"(the runs: {', '.join(r.path.name for r in runs[:8])})")


def table(runs: list[RunSummary], reference: RunSummary, root: Path) -> str:
    """The runs as aligned columns; the last one says how each config differs from ``reference``'s."""
    header = ["run", "status", "base", "steps", "best held-out", "selected", "config vs " + reference.path.name]
    rows = []
    for run in runs:
        differs = config_differences(run.config, reference.config)
        said = "(reference)" if run is reference else ("same" if not differs else difference_text(differs, 3))
        selected = "" if run.selected_step is None else f"{run.selected_step} ({_score(run.selected_heldout)})"
        name = os.path.relpath(run.path, root) if run.path != root else run.path.name
        rows.append([name, run.status, run.base, str(run.steps), _score(run.best_heldout), selected, said])
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header) - 1)]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row[:-1], widths, strict=True)) + "  " + row[-1]
             for row in [header, *rows]]
    return "\n".join(line.rstrip() for line in lines)


def as_json(runs: list[RunSummary], reference: RunSummary) -> dict[str, Any]:
    return {"reference": str(reference.path), "runs": [
        {"run": str(r.path), "status": r.status, "base": r.base, "steps": r.steps, "best_heldout": r.best_heldout,
         "selected_step": r.selected_step, "selected_heldout": r.selected_heldout,
         "baseline_heldout": r.baseline_heldout, "peak_mb": r.peak_mb, "wall_s": r.wall_s,
         "differences": [{"key": k, "this": a, "reference": b} for k, a, b in config_differences(r.config,
                                                                                                 reference.config)]}
        for r in runs]}


def cmd_runs(args: argparse.Namespace) -> int:
    root = Path(args.root)
    if not root.is_dir():
        raise UsageError(f"rlvr runs: {root} is not a folder")
    runs = find_runs(root)
    if not runs:
        print(f"no runs under {root}")
        return 0
    reference = _reference(runs, args.vs, root)
    print(json.dumps(as_json(runs, reference), indent=2) if args.json else table(runs, reference, root))
    return 0


def add_parser(sub: Any) -> None:
    r = sub.add_parser("runs", help="list and compare the runs under a folder from their records")
    r.add_argument("root", nargs="?", default="runs", help="folder holding run folders (default runs)")
    r.add_argument("--vs", help="the run every config is compared with (default the newest)")
    r.add_argument("--json", action="store_true", help="print JSON instead of a table")
    r.set_defaults(func=cmd_runs)
