"""Where a py-spy profile's samples went: per thread, per rlvr function, per leaf function.

Reads ``py-spy record --format raw --threads`` output: one line per distinct stack,
``thread (TID): NAME;outer (file.py:LINE);...;inner (file.py:LINE) COUNT``. Samples taken while
Python imported modules (a stack through ``_find_and_load``) are counted apart and left out of the
function tables, so a short run's start-up does not hide its steps. A function counts once per
sample however deeply it recurs; shares are of all samples. Standard library only.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any


def function_name(frame: str) -> str:
    """``Class.method (path/file.py)`` from py-spy's ``Class.method (path/file.py:LINE)``."""
    name, sep, where = frame.rpartition(" (")
    return f"{name} ({where.rstrip(')').rsplit(':', 1)[0]})" if sep else frame


def parse(text: str) -> tuple[Counter, Counter, Counter, int, int]:
    """(samples per thread, per function inclusive, per leaf function, import samples, all samples)."""
    threads, inclusive, leaves = Counter(), Counter(), Counter()
    imports = total = 0
    for line in text.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n, frames = int(count), stack.split(";")
        total += n
        threads[frames[0].split(": ", 1)[-1]] += n
        if any("_find_and_load" in f for f in frames):
            imports += n
            continue
        names = [function_name(f) for f in frames[1:]]
        for name in set(names):
            inclusive[name] += n
        if names:
            leaves[names[-1]] += n
    return threads, inclusive, leaves, imports, total


def summarize_profile(path: Path, top: int = 12) -> dict[str, Any]:
    """Print the profile's tables; return its figures."""
    threads, inclusive, leaves, imports, total = parse(path.read_text())
    if not total:
        raise SystemExit(f"{path}: no samples in it")
    share = lambda n: f"{n / total:6.1%}"  # noqa: E731
    print(f"\npy-spy: {total} samples ({path}); importing modules {share(imports).strip()}\n  threads:")
    for name, n in threads.most_common():
        print(f"    {share(n)}  {name}")
    ours = Counter({name: n for name, n in inclusive.items() if "rlvr/" in name})
    print(f"  rlvr functions (inclusive, top {top}):")
    for name, n in ours.most_common(top):
        print(f"    {share(n)}  {name}")
    print(f"  leaf functions (self, top {top}):")
    for name, n in leaves.most_common(top):
        print(f"    {share(n)}  {name}")
    return {"samples": total, "imports": imports, "threads": dict(threads), "rlvr": dict(ours.most_common(top)),
            "leaves": dict(leaves.most_common(top))}
