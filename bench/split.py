"""The held-out split's cost: rows per second and peak memory of ``rlvr.data.split.split_rows`` on
generated corpora with 10% twins, beside the exact-key split (the rule ``normal_form``: one hash per
row, no clusters) as the baseline, in the same run.

    python bench/split.py [--rows 100000,1000000] [--out FILE.json]

Each corpus holds word problems of their own words and templated sums, and for one row in ten a twin
of another row (a zero-width space, a Cyrillic letter, ``1,120`` for ``1120``, the answer as
``\\boxed{}``, an instruction after the question, a few-shot prompt quoting it, a word changed). Each
(size, rule) is measured in a fresh child process: seconds for the split of the already-loaded tasks,
rows per second, the process's peak RSS, and the RSS the tasks alone took before the split. The
report also names the machine (CPU model, cores, Python, whether numpy was used) and the share of
twin pairs that straddled the split (0 expected). Standard library (numpy used when installed).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import platform
import random
import resource
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from rlvr.data import minhash  # noqa: E402
from rlvr.data.split import split_rows  # noqa: E402
from rlvr.data.tasks import load_tasks  # noqa: E402

SALT = "rlvr-heldout-v1"
SYLLABLES = "ka lo mi ne ru sa ti vo be da fe gu ho ji pe zu".split()
WORDS = sorted({a + b + c for a in SYLLABLES for b in SYLLABLES for c in SYLLABLES})
NAMES = "Natalia Weng Betty Julie James Mark Albert Ken Alexis Tina".split()


def problem(r: random.Random, i: int) -> str:
    if i % 2:
        return f"What is {r.randint(0, 99999)} plus {r.randint(0, 99999)}?"
    w = r.sample(WORDS, 6)
    return (f"{r.choice(NAMES)} packed {r.randint(2, 999)} {w[0]}s at the {w[1]} and sold {r.randint(2, 999)} "
            f"{w[2]}s near the {w[3]}, then carried every {w[4]} into a {w[5]}. How many {w[0]}s are left?")


def twin(r: random.Random, prompt: str, answer: str) -> dict[str, Any]:
    kind = r.randrange(7)
    if kind == 0:
        return {"prompt": prompt.replace(" ", " \u200b", 1), "answer": answer}
    if kind == 1:
        return {"prompt": prompt.replace("a", "\u0430", 1), "answer": answer}
    if kind == 2:
        return {"prompt": prompt, "answer": f"\\boxed{{{answer}}}"}
    if kind == 3:
        return {"prompt": prompt + " Answer with a number only.", "answer": answer}
    if kind == 4:
        return {"prompt": f"Q: What is 2 plus 2?\nA: 4\n\nQ: {prompt}\nA:", "answer": answer}
    if kind == 5:
        return {"prompt": prompt.replace(" the ", " a ", 1), "answer": answer}
    return {"prompt": prompt.upper(), "answer": f"{answer}.0"}


def corpus(n: int, seed: int = 0) -> tuple[list[dict[str, Any]], list[tuple[int, int]]]:
    """``n`` rows, a tenth of them twins of an earlier row; the (row, twin) index pairs."""
    r = random.Random(seed)
    rows: list[dict[str, Any]] = []
    pairs: list[tuple[int, int]] = []
    for i in range(n):
        if i % 10 == 9:
            j = r.randrange(i - 9, i)
            pairs.append((j, i))
            rows.append(twin(r, rows[j]["prompt"], rows[j]["answer"]))
        else:
            rows.append({"prompt": problem(r, i), "answer": str(r.randint(0, 10**6))})
    return rows, pairs


def rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def measure(n: int, rule: str, queue: Any) -> None:
    rows, pairs = corpus(n)
    tasks = load_tasks(rows)
    del rows
    before = rss_mb()
    start = time.perf_counter()
    sides = split_rows(tasks, 0.2, SALT, rule)
    seconds = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    straddle = sum(sides.heldout[a] != sides.heldout[b] for a, b in pairs)
    queue.put({"rows": n, "rule": rule, "seconds": round(seconds, 2), "rows_per_s": round(n / seconds),
               "rss_tasks_mb": round(before), "peak_rss_mb": round(peak), "heldout": sum(sides.heldout),
               "twin_pairs": len(pairs), "pairs_straddling": straddle,
               "clusters": sides.summary.get("clusters"), "joined_near": sides.summary.get("joined_near"),
               "joined_quoted": sides.summary.get("joined_quoted")})


def machine() -> dict[str, Any]:
    model = ""
    try:
        model = next(line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                     if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return {"cpu": model or platform.processor(), "cores": len(os.sched_getaffinity(0)),
            "python": platform.python_version(), "numpy": minhash._numpy() is not None}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default="100000", help="comma-separated corpus sizes (default 100000)")
    parser.add_argument("--out", help="also write the report here as JSON")
    args = parser.parse_args()
    report: dict[str, Any] = {"machine": machine(), "runs": []}
    ctx = multiprocessing.get_context("fork")  # a fresh process each: its own peak RSS
    for n in (int(x) for x in args.rows.split(",")):
        for rule in ("normal_form", "prompt_twins"):
            queue = ctx.Queue()
            child = ctx.Process(target=measure, args=(n, rule, queue))
            child.start()
            result = queue.get()
            child.join()
            report["runs"].append(result)
            print(json.dumps(result), flush=True)
    print(json.dumps(report["machine"]))
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
