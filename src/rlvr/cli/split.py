"""``rlvr split CONFIG [--section.key=value ...] [--json]``: the held-out split a config gives, without
training.

The corpus is read exactly as ``rlvr train`` reads it (:func:`rlvr.wiring.tasks.task_tasks`, or
``envs_tasks`` for a run of several environments) and split by today's rule
(:mod:`rlvr.data.split`): the summary ``rlvr train`` prints at start, then the largest near-duplicate
clusters with an example pair each and the prompts with conflicting answers. With ``--json``, one
line per corpus row instead: ``{"line": N, "side": "train" | "heldout", "cluster": ID}``, ``N`` the
row's 0-based position in the corpus as read and ``ID`` its cluster's content id. Exits 2, saying
why, where ``rlvr train`` would refuse the corpus (``loop.corpus_min``, an empty side).
Part of the composition root.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from rlvr.data.split import split_rows, summary_text
from rlvr.data.tasks import corpus_refusal, sides_refusal


def add_parser(sub: Any) -> None:
    p = sub.add_parser("split", help="show the held-out split a config gives, its near-duplicate clusters and "
                       "conflicting answers: rlvr split CONFIG.toml [--section.key=value ...] [--json]")
    p.add_argument("config", nargs="?", help="TOML run config (defaults when omitted)")
    p.add_argument("--json", action="store_true", help="one JSON line per corpus row: line, side, cluster")
    p.set_defaults(func=cmd_split)


def cmd_split(args: argparse.Namespace) -> int:
    from rlvr.config.run import load_run_config
    from rlvr.wiring.tasks import run_tasks

    cfg = load_run_config(args.config, args.overrides)
    tasks = run_tasks(cfg)[0]
    refusal = corpus_refusal(tasks, cfg.loop.corpus_min)
    if refusal:
        print(f"rlvr: error: {refusal}", file=sys.stderr)
        return 2
    sides = split_rows(tasks, cfg.loop.heldout_frac, cfg.loop.split_salt)
    if args.json:
        out = sys.stdout
        for i, (held, cluster) in enumerate(zip(sides.heldout, sides.cluster, strict=True)):
            out.write(json.dumps({"line": i, "side": "heldout" if held else "train", "cluster": cluster}) + "\n")
    else:
        named = {i for c in sides.summary["largest"] for i in c["example"]} | {
            i for ids in sides.summary["conflicts"] for i in ids}
        shown = [t for t in tasks if t.id in named]
        text_of = {t.id: str(t.messages[-1].get("content", "")) for t in shown}
        for line in summary_text(sides.summary, text_of, {t.id: t.answer for t in shown}):
            print(line)
    refusal = sides_refusal(sides)
    if refusal:
        print(f"rlvr: error: `rlvr train` would refuse this split: {refusal}", file=sys.stderr)
        return 2
    return 0
