"""The split rule ``normal_form``, kept so that a run which recorded it resumes with the split it
started with, and lineage files of format 1 (keys of this rule) are still read.

Under this rule a row's key is the sha256 of the JSON text of ``[prompt, answer]``: ``prompt`` is
``["tokens", ids]`` for a token-in row, else ``["messages", [[role, text], ...]]`` without system
messages, ``text`` NFKC + case-folded + whitespace removed; the answer in its normal form
(:func:`rlvr.data.normal.normal_answer`). The ``round(n · frac)`` rows with the smallest salted key
are held out (ties by id), with every row that shares a key with one of them. Standard library only.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from rlvr.data.normal import SHORT_KEY, normal_answer, normal_text
from rlvr.seeding import stable_hash
from rlvr.types import Task

RULE = "normal_form"

_ENCODER = json.JSONEncoder(sort_keys=True, ensure_ascii=False)


def row_form(task: Task) -> str:
    """The row's normal form under this rule, as JSON text."""
    ids = task.info.get("prompt_ids") if isinstance(task.info, Mapping) else None
    prompt: list[Any] = (["tokens", [int(t) for t in ids]] if ids else
                         ["messages", [[m["role"], normal_text(str(m.get("content", "")))]
                                       for m in task.messages if m.get("role") != "system"]])
    return _ENCODER.encode([prompt, normal_answer(task.answer)])


def row_key(task: Task) -> str:
    return stable_hash(row_form(task))


def short_row_keys(tasks: Iterable[Task]) -> list[str]:
    return sorted({row_key(t)[:SHORT_KEY] for t in tasks})


def split_rows(tasks: Sequence[Task], n_heldout: int, salt: str) -> list[bool]:
    """Whether each task is held out, by this rule."""
    keyed = [(row_key(t), t) for t in tasks]
    ranked = sorted(keyed, key=lambda kt: (stable_hash(kt[0], salt), kt[1].id))
    held_keys = {key for key, _ in ranked[:n_heldout]}
    return [key in held_keys for key, _ in keyed]
