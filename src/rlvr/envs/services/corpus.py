"""Corpora for local search: passages and how they are read, shared by every index.

:func:`load_corpus` reads JSONL (``{"id", "text"}`` per line; files named ``*.jsonl`` or
``*.ndjson``) or plain text (one passage per non-empty line, id = line number); every error is a
:class:`~rlvr.errors.DataError` naming the file and line. :func:`as_passage` takes the shapes an
index accepts (a :class:`Passage`, an ``{"id", "text"}`` dict, an ``(id, text)`` pair).

Standard library only.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlvr.errors import DataError


@dataclass(frozen=True, slots=True)
class Passage:
    id: str
    text: str


def load_corpus(path: str | Path, *, format: str = "auto") -> list[Passage]:
    """Passages from a JSONL or plain-text file (``format``: ``"auto"``, ``"jsonl"`` or ``"text"``).

    ``"auto"`` reads ``*.jsonl``/``*.ndjson`` as JSONL and anything else as text. Errors are
    :class:`~rlvr.errors.DataError` naming the file and line.
    """
    path = Path(path)
    if format not in ("auto", "jsonl", "text"):
        raise ValueError(f"load_corpus: format must be 'auto', 'jsonl' or 'text', got {format!r}")
    if not path.is_file():
        raise DataError(f"corpus {path}: no such file")
    jsonl = format == "jsonl" or (format == "auto" and path.suffix.lower() in (".jsonl", ".ndjson"))
    passages: list[Passage] = []
    seen: set[str] = set()
    with path.open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            if not jsonl:
                passages.append(Passage(str(lineno), line.strip()))
                continue
            try:
                row = json.loads(line)
            except ValueError as exc:
                raise DataError(f"corpus {path} line {lineno}: invalid JSON ({exc})") from None
            if not isinstance(row, dict) or not isinstance(row.get("text"), str):
                raise DataError(f"corpus {path} line {lineno}: expected an object with a 'text' string")
            pid = row.get("id", lineno)
            if isinstance(pid, bool) or not isinstance(pid, (str, int)):
                raise DataError(f"corpus {path} line {lineno}: 'id' must be a string or an integer, got {pid!r}")
            pid = str(pid)
            if pid in seen:
                raise DataError(f"corpus {path} line {lineno}: duplicate id {pid!r}")
            seen.add(pid)
            passages.append(Passage(pid, row["text"]))
    if not passages:
        raise DataError(f"corpus {path}: no passages")
    return passages


def as_passage(item: Any, who: str) -> Passage:
    """A :class:`Passage` from a Passage, an ``{"id", "text"}`` dict or an ``(id, text)`` pair."""
    if isinstance(item, Passage):
        return item
    if isinstance(item, Mapping) and isinstance(item.get("text"), str):
        return Passage(str(item.get("id", "")), item["text"])
    if isinstance(item, tuple) and len(item) == 2 and isinstance(item[1], str):
        return Passage(str(item[0]), item[1])
    raise DataError(f"{who}: a passage must be a Passage, a {{'id', 'text'}} dict or an (id, text) pair, "
                    f"got {item!r:.100}")
