"""The normal form of a row: what decides its side of the held-out split, and what counts as "the same
row" when a model's training set is compared with a run's held-out rows.

Two rows that differ only in ways a model cannot learn from must land on the same side, or a
near-copy of a held-out row is trained on. The normal form of a row is the JSON text of::

    [prompt, answer]

- ``prompt``: for a token-in row (``info.prompt_ids``), ``["tokens", ids]``: the tokens are what the
  model sees, whatever text came with them. Otherwise ``["messages", [[role, text], ...]]`` over the
  row's messages, **system messages left out** (an added or changed system prompt does not make
  another question). A plain-text ``prompt`` is the single user message it becomes.
- ``text``: Unicode NFKC, case-folded, with **every whitespace character removed** (``"What is
  2+3? "`` and ``"what is 2 + 3?"`` are one question).
- ``answer``: a number, or a string that reads as a decimal number (optional sign, ``1,234``
  grouping, fraction, exponent), becomes the shortest plain decimal of its value (``25``, ``"25"``,
  ``25.0`` and ``" 25 "`` are all ``"25"``); other strings are normalised as ``text``; ``true`` /
  ``false`` / ``null`` stay themselves; lists and mappings are normalised element by element (keys
  as they are).

:func:`split_key` is the sha256 of that text: a stable content hash (never Python's ``hash()``),
independent of corpus order, row ids and ``info`` (but ``info.prompt_ids``). Standard library only.
"""

from __future__ import annotations

import json
import math
import re
import unicodedata
from collections.abc import Iterable, Mapping
from decimal import MAX_EMAX, MIN_EMIN, Context, Decimal, InvalidOperation
from typing import Any

from rlvr.seeding import stable_hash
from rlvr.types import Task

# How many hex digits of a split key a lineage file keeps (64 bits: a chance collision among a
# million rows is about 3e-8).
SHORT_KEY = 16

_ENCODER = json.JSONEncoder(sort_keys=True, ensure_ascii=False)  # one instance: json.dumps builds one per call
_EXACT = Context(prec=100, Emax=MAX_EMAX, Emin=MIN_EMIN)
_NUMBER = re.compile(r"[+-]?(?:\d{1,3}(?:,\d{3})+|\d+)?(?:\.\d+)?(?:[eE][+-]?\d+)?")
_DIGIT = re.compile(r"\d")


def normal_text(text: str) -> str:
    """NFKC, case-folded, every whitespace character removed."""
    if text.isascii():  # NFKC leaves ASCII as it is, and casefold is lower there
        return "".join(text.lower().split())
    return "".join(unicodedata.normalize("NFKC", text).casefold().split())


def _number(text: str) -> str | None:
    """The plain decimal of ``text`` when it reads as a finite number, else ``None``."""
    compact = "".join(text.split())
    if compact.isascii() and compact.isdigit():  # the common case, exactly as the general one reads it
        return compact.lstrip("0") or "0"
    if not compact or not _NUMBER.fullmatch(compact) or not _DIGIT.search(compact):
        return None
    try:
        return _plain(Decimal(compact.replace(",", "")))
    except InvalidOperation:
        return None


def _plain(value: Decimal) -> str:
    # Exact: precision enough for every digit given, no exponent bound (a long number never rounds).
    digits = len(value.as_tuple().digits)
    context = _EXACT if digits <= _EXACT.prec else Context(prec=digits, Emax=MAX_EMAX, Emin=MIN_EMIN)
    value = context.normalize(value)
    if value.is_zero():
        return "0"
    # Plain digits up to a sane length; beyond, the (equally canonical) scientific form.
    return format(value, "f") if abs(value.adjusted()) <= 60 else str(value)


def normal_answer(answer: Any) -> Any:
    """The answer's normal form (see the module doc)."""
    if answer is None or isinstance(answer, bool):
        return answer
    if isinstance(answer, int):
        return str(answer)  # as a digit string reads (leading zeros dropped, "-0" is "0")
    if isinstance(answer, float):
        return _plain(Decimal(repr(answer))) if math.isfinite(answer) else repr(answer)
    if isinstance(answer, str):
        number = _number(answer)
        return number if number is not None else normal_text(answer)
    if isinstance(answer, Mapping):
        return {str(k): normal_answer(v) for k, v in sorted(answer.items(), key=lambda kv: str(kv[0]))}
    if isinstance(answer, (list, tuple)):
        return [normal_answer(v) for v in answer]
    return repr(answer)


def normal_prompt(task: Task) -> list[Any]:
    """``["tokens", ids]`` for a token-in row, else ``["messages", [[role, text], ...]]`` without
    system messages."""
    ids = task.info.get("prompt_ids") if isinstance(task.info, Mapping) else None
    if ids:
        return ["tokens", [int(t) for t in ids]]
    return ["messages", [[m["role"], normal_text(str(m.get("content", "")))]
                         for m in task.messages if m.get("role") != "system"]]


def normal_form(task: Task) -> str:
    """The row's normal form as JSON text (see the module doc)."""
    return _ENCODER.encode([normal_prompt(task), normal_answer(task.answer)])


def split_key(task: Task) -> str:
    """sha256 of :func:`normal_form`: near-duplicate rows share it."""
    return stable_hash(normal_form(task))


def short_keys(tasks: Iterable[Task]) -> list[str]:
    """The sorted, distinct :data:`SHORT_KEY`-digit split keys of ``tasks`` (what lineage files keep)."""
    return sorted({split_key(t)[:SHORT_KEY] for t in tasks})


def overlap(tasks: Iterable[Task], keys: Iterable[str]) -> list[Task]:
    """The tasks whose split key (full or short) is among ``keys``, in the order given."""
    known = set(keys)
    return [t for t in tasks if (k := split_key(t)) in known or k[:SHORT_KEY] in known]


def count_in(tasks: Iterable[Task], keys: Iterable[str]) -> int:
    """How many of ``tasks`` have a split key (full or short) among ``keys``."""
    return len(overlap(tasks, keys))
