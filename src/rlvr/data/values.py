"""Values no row may hold, and how big a row may be: checks every reader applies before a row is used.

- A non-finite number (NaN, Infinity) in a row's ``answer``, at any depth: no reward can compare a
  reply with it (NaN equals nothing) and the run record cannot hold it (JSON has no NaN).
- A NUL character in any string of the row (keys included): tokenizers, chat templates, inference
  servers and C libraries cut or refuse text at NUL, so the row the model sees would not be the row
  on disk. Bytes values (an image column) are not text and are not checked.
- A row larger than ``max_bytes`` (:func:`row_size`): refused naming the bound, before anything
  tokenizes or renders it. Line formats check the raw line while reading (:mod:`rlvr.data.readers`).

Walks are iterative, so a deeply nested row is refused by its depth (:data:`MAX_DEPTH`), never by a
``RecursionError``. Standard library only.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from rlvr.errors import DataError

MAX_DEPTH = 64  # nesting no row of any dataset we know needs; far below Python's recursion limit
DEFAULT_MAX_ROW_MB = 8.0


def _children(value: Any) -> list[tuple[str, Any]]:
    if isinstance(value, Mapping):
        return [(f".{k}", v) for k, v in value.items()] + [(f".<key {k!r}>", k) for k in value]
    if isinstance(value, (list, tuple)):
        return [(f"[{i}]", v) for i, v in enumerate(value)]
    return []


def _walk(value: Any, path: str, where: str) -> Any:
    """Every ``(path, value)`` below ``value``; too deep a nesting is a :class:`DataError`."""
    stack = [(path, value, 0)]
    while stack:
        here, node, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise DataError(f"{where}: field {here!r} is nested more than {MAX_DEPTH} levels deep")
        yield here, node
        stack.extend((here + step, child, depth + 1) for step, child in reversed(_children(node)))


def _suspect(value: Any, numbers: bool) -> bool:
    """Whether ``value`` may hold what :func:`check_values` refuses (a NUL; with ``numbers``, a non-finite
    float; too deep a nesting): a quick pass with no paths, so a good row costs one walk."""
    stack = [(value, 0)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, str):
            if "\x00" in node:
                return True
        elif isinstance(node, float):
            if numbers and not math.isfinite(node):
                return True
        elif isinstance(node, (Mapping, list, tuple)):
            if node and depth >= MAX_DEPTH:
                return True
            children = [*node.keys(), *node.values()] if isinstance(node, Mapping) else node
            stack.extend((child, depth + 1) for child in children)
    return False


def check_values(row: Mapping[str, Any], where: str) -> None:
    """Refuse a non-finite number in ``answer`` and a NUL character anywhere, naming the row and field."""
    if not _suspect(row.get("answer"), True) and not _suspect(row, False):
        return
    for path, value in _walk(row.get("answer"), "answer", where):
        if isinstance(value, float) and not math.isfinite(value):
            raise DataError(f"{where}: field {path!r} is {value!r}, not a finite number; no reply can match it "
                            "and the run record cannot store it: fix the row or drop it from the data")
    for key, column in row.items():
        for path, value in _walk(column, str(key), where):
            if isinstance(value, str) and "\x00" in value:
                at = value.index("\x00")
                raise DataError(f"{where}: field {path!r} holds a NUL character (at character {at}); "
                                "tokenizers and servers cut text there: remove it from the data")


def row_size(row: Any, limit: int) -> int:
    """About how many bytes ``row`` takes as JSON text: characters of its strings (keys included),
    bytes of its bytes values, 8 per other scalar. Stops counting once past ``limit``."""
    total, stack = 0, [row]
    while stack and total <= limit:
        node = stack.pop()
        if isinstance(node, (str, bytes, bytearray)):
            total += len(node)
        elif isinstance(node, Mapping):
            stack.extend(node.keys())
            stack.extend(node.values())
        elif isinstance(node, (list, tuple)):
            stack.extend(node)
        else:
            total += 8
    return total


def check_size(row: Any, max_bytes: int | None, where: str) -> None:
    """Refuse a row over ``max_bytes`` (``None``: no bound)."""
    if max_bytes is not None and row_size(row, max_bytes) > max_bytes:
        raise DataError(f"{where}: the row is over {size_text(max_bytes)} (task.max_row_mb); a row this large cannot "
                        "be a prompt the model takes: drop it, or raise task.max_row_mb for rows with large info")


def size_text(n: int) -> str:
    """A byte count as people read it: ``8 MiB``, ``1.5 MiB``, ``1048 bytes``."""
    return f"{n / 2**20:g} MiB" if n >= 2**20 else f"{n} bytes"
