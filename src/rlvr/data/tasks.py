"""Rows to tasks, the frozen held-out split, and the cursor that draws training tasks.

Invariants:
- A row is validated when it becomes a :class:`Task`; a bad row fails with its source, index and
  field named (a non-finite answer and a NUL character included: :mod:`rlvr.data.values`).
  Nothing is dropped silently.
- The split depends only on row *content* (and a salt), never on order or seed: reordering the
  corpus gives the same split, and rows of one near-duplicate cluster (:mod:`rlvr.data.split`: the
  same normal prompt whatever the answer, near-identical prompts, a prompt quoted in another)
  always land on the same side.
- The cursor walks a per-epoch permutation, derived from ``(seed, epoch)``, of the tasks in hash
  order, so the task drawn at any step is reproducible from the seed and the cursor state alone,
  survives reordering of the corpus, and never repeats within an epoch.
Standard library only.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rlvr.data.fields import FieldMap, fold_columns, map_row
from rlvr.data.split import RULES, SPLIT_BY, Sides, split_rows
from rlvr.data.values import check_values
from rlvr.errors import DataError, RLLoopError
from rlvr.seeding import rng_for, stable_hash
from rlvr.types import Message, Split, Task

ROLES = frozenset({"system", "user", "assistant", "tool"})


def rows_of(bench: Any) -> list[Any]:
    """The rows of ``bench``: its ``questions`` list if it has one, else the iterable itself."""
    questions = getattr(bench, "questions", None)
    if questions is not None:
        return list(questions)
    if isinstance(bench, (str, bytes, Mapping)) or not isinstance(bench, Iterable):
        raise DataError(
            f"bench must have a 'questions' list or be an iterable of rows, got {type(bench).__name__}"
        )
    return list(bench)


def _messages(row: Mapping[str, Any], where: str) -> tuple[Message, ...]:
    if "messages" in row or isinstance(row.get("prompt"), list):
        # A list-valued prompt is TRL's conversational format: messages under another name.
        key = "messages" if "messages" in row else "prompt"
        msgs = row[key]
        if not isinstance(msgs, list) or not msgs:
            raise DataError(f"{where}: field {key!r} must be a non-empty list of messages")
        for i, m in enumerate(msgs):
            if not isinstance(m, Mapping) or not isinstance(m.get("role"), str) or m["role"] not in ROLES:
                raise DataError(f"{where}: {key}[{i}] needs a 'role' in {sorted(ROLES)}")
            if not isinstance(m.get("content"), str):
                raise DataError(f"{where}: {key}[{i}].content must be a string")
        return tuple(dict(m) for m in msgs)
    prompt = row.get("prompt")
    if not isinstance(prompt, str) or not prompt.strip():
        raise DataError(f"{where}: needs a non-empty string 'prompt' or a 'messages' list; columns: "
                        f"{sorted(row)} (map yours with task.fields, e.g. fields = {{prompt = \"question\"}})")
    return ({"role": "user", "content": prompt},)


def to_task(row: Any, index: int, source: str = "bench", *, where: str | None = None,
            fields: FieldMap | None = None, require_answer: bool = True) -> Task:
    """Validate one row ``{"prompt" | "messages", "answer", "info"?, "id"?}`` into a Task; with
    ``fields``, the row is first mapped from its own columns (:func:`rlvr.data.fields.map_row`), without
    them its other columns go into ``info`` (:func:`rlvr.data.fields.fold_columns`).
    ``require_answer=False`` accepts a prompt-only row (its ``answer`` is ``None``): for rewards that
    take no answer, as TRL's quickstart rewards (a length, a format) do.

    Errors start with ``where`` (default ``"{source} row {index}"``; file readers pass a line).
    """
    where = where or f"{source} row {index}"
    # Every column reaches the reward by name (in info), mapped or not: no column is dropped.
    row = map_row(row, fields, where) if fields is not None else fold_columns(row, where)
    if not isinstance(row, Mapping):
        raise DataError(f"{where}: a row must be a mapping, got {type(row).__name__}")
    messages = _messages(row, where)
    check_values(row, where)
    if row.get("answer") is None and require_answer:
        hint = "" if fields is not None else (" (map another column with task.fields, "
                                              "e.g. fields = {answer = \"solution\"})")
        raise DataError(f"{where}: field 'answer' is missing; columns: {sorted(row)}{hint}")
    info = row.get("info", {})
    if not isinstance(info, Mapping):
        raise DataError(f"{where}: field 'info' must be a mapping")
    ids = info.get("prompt_ids")
    if ids is not None and (not isinstance(ids, (list, tuple)) or not ids or not all(
            isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in ids)):
        raise DataError(f"{where}: field 'info.prompt_ids' must be a non-empty list of token ids (integers >= 0)")
    try:
        content = json.dumps([list(messages), row.get("answer")], sort_keys=True)
    except (TypeError, ValueError, RecursionError) as exc:
        raise DataError(f"{where}: 'messages' and 'answer' must be JSON-serialisable ({exc})") from None
    digest = stable_hash(content)
    conversational = "messages" in row or not isinstance(row.get("prompt"), str)
    return Task(id=str(row.get("id", digest[:16])), messages=messages, answer=row.get("answer"),
                content_hash=digest, info=dict(info), conversational=conversational)


def load_tasks(bench: Any, source: str = "bench", *, fields: FieldMap | None = None,
               require_answer: bool = True) -> list[Task]:
    """All rows of ``bench`` as tasks (mapped by ``fields`` when given; see :func:`to_task` for
    ``require_answer``), with ids made unique (duplicates get ``~1``, ``~2``...)."""
    tasks: list[Task] = []
    used: set[str] = set()
    for i, row in enumerate(rows_of(bench)):
        task = row if isinstance(row, Task) else to_task(row, i, source, fields=fields,  # a Task is validated
                                                         require_answer=require_answer)
        new_id, n = task.id, 0
        while new_id in used:
            n += 1
            new_id = f"{task.id}~{n}"
        used.add(new_id)
        if new_id != task.id:
            task = dataclasses.replace(task, id=new_id)
        tasks.append(task)
    return tasks


def split_tasks(tasks: Sequence[Task], heldout_frac: float, salt: str,
                rule: str = SPLIT_BY) -> tuple[list[Task], list[Task]]:
    """``(train, heldout)`` by ``rule`` (:mod:`rlvr.data.split`: today, near-duplicate clusters of the
    normal prompt, each wholly on one side). Order-independent; both sides keep corpus order."""
    return _partition(tasks, split_rows(tasks, heldout_frac, salt, rule))


def _partition(tasks: Sequence[Task], sides: Sides) -> tuple[list[Task], list[Task]]:
    """``(train, heldout)`` as ``sides`` assigns ``tasks``, each in corpus order."""
    return ([t for t, h in zip(tasks, sides.heldout, strict=True) if not h],
            [t for t, h in zip(tasks, sides.heldout, strict=True) if h])


def carve(tasks: Sequence[Task], heldout_frac: float, salt: str, corpus_min: int = 1,
          rule: str = SPLIT_BY) -> Split:
    """The one place a corpus becomes a :class:`~rlvr.types.Split`: refuse a corpus under
    ``corpus_min`` distinct rows, hold out by ``rule`` (:func:`rlvr.data.split.rule_of` gives a
    resumed run's), refuse an empty side. The manifest records the rule and the split's summary."""
    refusal = corpus_refusal(tasks, corpus_min)
    if refusal:
        raise RLLoopError(refusal)
    sides = split_rows(tasks, heldout_frac, salt, rule)
    refusal = sides_refusal(sides)
    if refusal:
        raise RLLoopError(refusal)
    train, heldout = _partition(tasks, sides)
    manifest = split_manifest(train, heldout, rule, sides.summary)
    return Split(tuple(train), tuple(heldout), heldout_frac, salt, corpus_min, manifest)


def corpus_refusal(tasks: Sequence[Task], corpus_min: int) -> str | None:
    """Why :func:`carve` refuses this corpus before splitting it: fewer than ``corpus_min`` distinct rows."""
    distinct = len({t.content_hash for t in tasks})
    if distinct >= corpus_min:
        return None
    dupes = f" ({len(tasks) - distinct} are duplicates)" if distinct < len(tasks) else ""
    return (f"corpus has {distinct} distinct rows{dupes}, below corpus_min={corpus_min}: "
            "small corpora mode-collapse. Add rows or lower corpus_min deliberately.")


def sides_refusal(sides: Sides) -> str | None:
    """Why :func:`carve` refuses a split: a side left empty."""
    n_held = sum(sides.heldout)
    if 0 < n_held < len(sides.heldout):
        return None
    why = ""
    if sides.summary.get("kept_in_train"):
        why = (f"; {sides.summary['kept_in_train']} near-duplicate clusters are larger than the held-out side "
               "(`rlvr split CONFIG` lists them)")
    return (f"the split left {len(sides.heldout) - n_held} training and {n_held} held-out tasks; "
            f"both need at least one (adjust heldout_frac or add distinct rows){why}")


def with_system_prompt(task: Task, prompt: str | None) -> Task:
    """``task`` shown with ``prompt`` as its first, system, message; unchanged without a prompt or when
    the row brings its own system message (the row's is the more specific). The content hash is the
    row's, untouched: the split is by what the row says, not by how it is shown."""
    if not prompt or (task.messages and task.messages[0].get("role") == "system"):
        return task
    return dataclasses.replace(task, messages=({"role": "system", "content": prompt}, *task.messages))


def split_manifest(train: Sequence[Task], heldout: Sequence[Task], rule: str = SPLIT_BY,
                   summary: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Counts and hashes that pin the split in the run record, the rule that made it (``split_by``)
    and its ``summary`` (clusters, conflicting answers: :func:`rlvr.data.split.summary_line`)."""

    def digest(ts: Sequence[Task]) -> str:
        return stable_hash("\n".join(sorted(t.content_hash for t in ts)))

    return {"n_train": len(train), "n_heldout": len(heldout),
            "train_hash": digest(train), "heldout_hash": digest(heldout),
            "heldout_ids": sorted(t.id for t in heldout), "split_by": rule,
            **({"summary": dict(summary)} if summary else {})}


def other_split_reason(recorded: Mapping[str, Any]) -> str:
    """Why a run's recorded split differs from the one its corpus gives now: a split made before rows
    were split by their normal form (the record names no ``split_by``), or changed data."""
    if recorded and "split_by" not in recorded:
        return ("the run was split by an earlier rlvr, by exact row content; this one splits by each row's normal "
                "form (docs/heldout.md), which gives another held-out set: finish the run with the rlvr that "
                "started it, or start it again")
    if recorded and recorded.get("split_by") not in RULES:
        return (f"the run was split by rule {recorded.get('split_by')!r}, which this rlvr does not know: finish the "
                "run with the rlvr that started it")
    return "its data changed since the run began"


@dataclass
class TaskCursor:
    """Draws training tasks epoch by epoch from a seeded per-epoch permutation."""

    tasks: Sequence[Task]
    seed: int
    epoch: int = 0
    position: int = 0
    _shuffled: tuple[int, list[int]] | None = dataclasses.field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        # Hash order, not corpus order: the draw at each step survives a reordered corpus.
        self.tasks = sorted(self.tasks, key=lambda t: (t.content_hash, t.id))

    def _order(self, epoch: int) -> list[int]:
        """The epoch's permutation, shuffled once per epoch (rows are drawn one at a time: a shuffle of
        the whole list per draw costs a large dataset seconds a step)."""
        if self._shuffled is None or self._shuffled[0] != epoch:
            order = list(range(len(self.tasks)))
            rng_for(self.seed, "epoch", epoch).shuffle(order)
            self._shuffled = (epoch, order)
        return self._shuffled[1]

    def take(self, n: int) -> list[Task]:
        """The next ``n`` tasks; crosses into the next epoch's permutation when one runs out."""
        if not self.tasks:
            raise DataError("no training tasks to draw from")
        out: list[Task] = []
        order = self._order(self.epoch)
        while len(out) < n:
            if self.position == len(order):
                self.epoch, self.position = self.epoch + 1, 0
                order = self._order(self.epoch)
            out.append(self.tasks[order[self.position]])
            self.position += 1
        return out

    def draw(self) -> tuple[Task, int]:
        """The next task and its draw index (``epoch * len(tasks) + position``): the coordinate that
        tells this draw of a task from any other draw of it, so seeds derived from it never repeat."""
        index = self.epoch * len(self.tasks) + self.position
        return self.take(1)[0], index

    def state(self) -> dict[str, int]:
        return {"epoch": self.epoch, "position": self.position}

    def restore(self, state: Mapping[str, int]) -> None:
        self.epoch, self.position = int(state["epoch"]), int(state["position"])


def mean(xs: Iterable[float]) -> float:
    xs = list(xs)
    return math.fsum(xs) / len(xs) if xs else float("nan")
