"""Which side of the held-out split each row lands on, by the split rule a run records.

The rule today, ``prompt_twins`` (:data:`SPLIT_BY`): rows are grouped into near-duplicate clusters
(:mod:`rlvr.data.twins`: same normal prompt, near-identical prompts with the same numbers, a prompt
quoted inside another) and each cluster goes **wholly** to one side. Clusters are ranked by the
salted hash of their content (their smallest prompt key), and taken for the held-out side in that
order while they fit its target, ``round(n · heldout_frac)`` rows (at least 1, at most n - 1); a
cluster that does not fit stays on the training side, so no cluster, however large, swallows the
held-out side. A cluster holding a prompt that more than
:data:`~rlvr.data.twins.QUOTE_LIMIT` others quote is kept on the training side. Order-independent:
reordering the corpus gives the same split.

The rule before, ``normal_form`` (:mod:`rlvr.data.normal_v1`), is kept for runs that recorded it: a
run resumes with the rule in its ``run.json`` (:func:`rule_of`). Every split comes with a summary
(:func:`summary_line`, :func:`summary_text`): counts, the largest clusters with an example pair,
clusters over :func:`large_bound`, prompts with conflicting answers. Standard library, numpy optional.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rlvr.data import normal_v1, twins
from rlvr.errors import RLLoopError
from rlvr.seeding import stable_hash
from rlvr.types import Task

SPLIT_BY = "prompt_twins"
RULES = (SPLIT_BY, normal_v1.RULE)
SHOWN = 5  # clusters and conflicts a summary names


def large_bound(n_rows: int) -> int:
    """Clusters over this many rows are reported as large: 1% of the corpus, and at least 16."""
    return max(16, math.ceil(0.01 * n_rows))


def heldout_target(n_rows: int, heldout_frac: float) -> int:
    return min(n_rows - 1, max(1, round(n_rows * heldout_frac)))


def rule_of(recorded: Mapping[str, Any] | None) -> str:
    """The rule a recorded split manifest names (a run resumes with it); today's for a new run."""
    if not recorded:
        return SPLIT_BY
    rule = recorded.get("split_by")
    return rule if rule in RULES else SPLIT_BY  # none or unknown: the hashes will not match, and resume says why


def check_rule(rule: str) -> None:
    if rule not in RULES:
        raise RLLoopError(f"split rule {rule!r} is not one this rlvr knows ({', '.join(RULES)})")


@dataclass
class Sides:
    """Each row's side (``heldout[i]``), cluster (``cluster[i]``, a content id) and the summary."""

    heldout: list[bool]
    cluster: list[str]
    summary: dict[str, Any]


def split_rows(tasks: Sequence[Task], heldout_frac: float, salt: str, rule: str = SPLIT_BY) -> Sides:
    """The side of each of ``tasks`` by ``rule`` (see the module doc)."""
    check_rule(rule)
    target = heldout_target(len(tasks), heldout_frac)
    if rule == normal_v1.RULE:
        sides = normal_v1.split_rows(tasks, target, salt)
        return Sides(sides, ["" for _ in tasks], {"rule": rule, "rows": len(tasks), "heldout": sum(sides),
                                                  "train": len(tasks) - sum(sides)})
    found = twins.find_clusters(tasks)
    p, root = found.prompts, found.root
    size: Counter[int] = Counter()
    content: dict[int, int] = {}
    for k, r in enumerate(root):
        size[r] += p.rows[k]
        content[r] = min(content.get(r, p.keys[k]), p.keys[k])
    ids = {r: f"{c:016x}" for r, c in content.items()}
    ranked = sorted((r for r in size if r not in found.pinned), key=lambda r: stable_hash(ids[r], salt))
    held_clusters: set[int] = set()
    held = 0
    for r in ranked:
        if held >= target:
            break
        if held + size[r] <= target:
            held_clusters.add(r)
            held += size[r]
    heldout = [root[k] in held_clusters for k in p.key_of_row]
    summary = _summary(tasks, found, size, ids, held_clusters, target)
    return Sides(heldout, [ids[root[k]] for k in p.key_of_row], summary)


def _min_ids(tasks: Sequence[Task], key_of_row: Sequence[int], wanted: set[int]) -> dict[int, str]:
    """The smallest row id of each wanted prompt: examples named by content, not by row order."""
    out: dict[int, str] = {}
    for i, k in enumerate(key_of_row):
        if k in wanted and (k not in out or tasks[i].id < out[k]):
            out[k] = tasks[i].id
    return out


def _summary(tasks: Sequence[Task], found: twins.Clusters, size: Counter[int], ids: dict[int, str],
             held: set[int], target: int) -> dict[str, Any]:
    p, root = found.prompts, found.root
    n = len(tasks)
    bound = large_bound(n)
    prompts_in: Counter[int] = Counter(root)
    multi = [r for r in size if size[r] > 1]
    largest = sorted(multi, key=lambda r: (-size[r], ids[r]))[:SHOWN]
    example: dict[int, tuple[int, int, str]] = {}
    for a, b, why in found.links:
        r = root[a]
        keys = tuple(sorted((p.keys[a], p.keys[b])))
        if r in largest and (r not in example or keys < tuple(sorted((p.keys[example[r][0]], p.keys[example[r][1]])))):
            example[r] = (a, b, why)
    wanted = {k for a, b, _ in example.values() for k in (a, b)} | {r for r in largest if prompts_in[r] == 1}
    names = _min_ids(tasks, p.key_of_row, wanted)
    same = {r: sorted(t.id for t, k in zip(tasks, p.key_of_row, strict=True) if k == r)[:2]
            for r in largest if prompts_in[r] == 1}
    shown = []
    for r in largest:
        a, b, why = example.get(r, (r, r, "same prompt"))
        pair = same[r] if prompts_in[r] == 1 else sorted((names[a], names[b]))
        shown.append({"cluster": ids[r], "rows": size[r], "prompts": prompts_in[r],
                      "side": "heldout" if r in held else "train", "example": pair, "why": why})
    joined = Counter(why for _, _, why in found.links)
    conflicts = sorted(sorted(tasks[i].id for i in rows) for rows in found.conflicts.values())
    return {"rule": SPLIT_BY, "rows": n, "train": n - sum(size[r] for r in held),
            "heldout": sum(size[r] for r in held), "prompts": len(p.keys), "clusters": len(size),
            "twin_rows": sum(size[r] for r in multi), "joined_near": joined["near"],
            "joined_quoted": joined["quoted"], "largest": shown, "large_bound": bound,
            "large": sum(1 for r in size if size[r] > bound),
            "kept_in_train": sum(1 for r in size if size[r] > target and r not in found.pinned),
            "pinned_prompts": len(found.hubs), "pinned_rows": sum(size[r] for r in found.pinned),
            "quote_checks_cut": found.unchecked, "conflicting_answers": len(conflicts),
            "conflicts": conflicts[:SHOWN]}


def summary_line(summary: Mapping[str, Any]) -> str:
    """One line: what ``rlvr train`` prints at start and ``rlvr split`` first."""
    s = summary
    line = f"split ({s['rule']}): {s['rows']} rows -> {s['train']} train, {s['heldout']} held out"
    if "clusters" not in s:
        return line
    line += (f"; {s['prompts']} distinct prompts in {s['clusters']} clusters ({s['twin_rows']} rows have twins: "
             f"{s['joined_near']} near, {s['joined_quoted']} quoted joins)")
    if s["largest"]:
        line += f"; largest cluster {s['largest'][0]['rows']} rows"
    if s["large"]:
        line += f"; {s['large']} over {s['large_bound']} rows"
    if s["kept_in_train"]:
        line += f"; {s['kept_in_train']} larger than the held-out side, kept in train"
    if s["pinned_prompts"]:
        line += f"; {s['pinned_prompts']} widely quoted prompts kept in train"
    if s["conflicting_answers"]:
        line += f"; {s['conflicting_answers']} prompts with conflicting answers"
    return line


def summary_text(summary: Mapping[str, Any], text_of: Mapping[str, str] | None = None,
                 answer_of: Mapping[str, Any] | None = None) -> list[str]:
    """The summary as lines: :func:`summary_line`, then each large cluster with its example pair and
    each conflict (``text_of``: a row id's prompt, shown shortened; ``answer_of``: its answer)."""
    lines = [summary_line(summary)]
    if "clusters" not in summary:
        return lines

    def show(row_id: str) -> str:
        text = (text_of or {}).get(row_id)
        return row_id if text is None else f"{row_id} {_short(text)!r}"

    for c in summary["largest"]:
        over = " (over the bound)" if c["rows"] > summary["large_bound"] else ""
        lines.append(f"  cluster {c['cluster']}: {c['rows']} rows, {c['prompts']} prompts, {c['side']}{over}; "
                     f"{c['why']}: {show(c['example'][0])} ~ {show(c['example'][1])}")
    if summary["quote_checks_cut"]:
        lines.append(f"  {summary['quote_checks_cut']} prompts' quotes were checked in part "
                     f"(their rarest sentence is in more than {twins.QUOTE_LIMIT + 2} prompts)")
    for ids in summary["conflicts"]:
        answers = ", ".join(f"{i}: {(answer_of or {}).get(i)!r}" for i in ids)
        lines.append(f"  conflicting answers for {show(ids[0])}: {answers}")
    return lines


def _short(text: str, width: int = 60) -> str:
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 3] + "..."
