"""Rows in the field's usual shapes, mapped to rlvr's row schema: column mapping and answer extraction.

rlvr's own row schema is ``{"prompt" | "messages", "answer", "info"?, "id"?}``. Datasets as users
have them name their columns otherwise (GSM8K: ``question`` / ``answer`` with the gold after
``####``; TRL: ``prompt`` as a message list and ``solution``; verl: ``prompt`` as messages and
``reward_model.ground_truth``). A :class:`FieldMap` (``task.fields`` and ``task.answer_extract``)
maps such a row once, where rows are read:

- ``fields`` maps a target (``prompt``, ``messages``, ``answer``, ``info``, ``id``) to a column, or to a
  dotted path into nested columns (``"reward_model.ground_truth"``); a target left out reads the column
  of its own name when there is one. A list-valued ``prompt`` is read as messages.
- ``info`` holds every column but the prompt's (and the ``info``/``id`` columns', which it merges or
  names): the answer's column stays there as it was in the row, before extraction, because rewards
  written for TRL read the gold from their own column name (``solution=``), as TRL passes every column.
- without a map (:func:`fold_columns`), a row in rlvr's schema keeps its ``prompt``/``messages``,
  ``answer``, ``id`` and ``info``, and every other column goes into ``info`` the same way: no column
  is dropped, with or without ``task.fields``.
- ``answer_extract`` turns the gold answer into what a reply is compared against: ``"####"`` (the text
  after the last ``####``, stripped, thousands commas removed), ``"boxed"`` (the last ``\\boxed{...}``,
  nested braces kept), ``"re:PATTERN"`` (the first group of the first match, else the whole match), or a
  function ``answer -> answer`` named by an import path or file spec (resolved by the caller, which may
  import user code; this module does not).

Invariants: mapping is a pure function of the row; a row the map cannot read fails naming the row, the
target and the columns it has; an extractor that finds nothing fails naming the row (a gold answer
is never silently emptied). Standard library only.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from rlvr.errors import DataError

__all__ = ["BUILTIN_EXTRACTORS", "TARGETS", "FieldMap", "fold_columns", "last_boxed", "make_extractor", "map_row"]

TARGETS = ("prompt", "messages", "answer", "info", "id")
BUILTIN_EXTRACTORS = ("####", "boxed")

Extractor = Callable[[Any], Any]
_MISSING = object()


@dataclass(frozen=True)
class FieldMap:
    """How a row's columns become rlvr's row: ``fields`` (target -> column or dotted path) and the
    answer extractor (``extract``, described by ``extract_spec`` in messages)."""

    fields: Mapping[str, str] = field(default_factory=dict)
    extract: Extractor | None = None
    extract_spec: str | None = None

    @classmethod
    def build(cls, fields: Mapping[str, str] | None = None, answer_extract: str | None = None,
              load: Callable[[str], Any] | None = None) -> FieldMap:
        """The map of ``task.fields`` and ``task.answer_extract``; ``load`` resolves a function spec."""
        return cls(dict(fields or {}), make_extractor(answer_extract, load), answer_extract)

    def __post_init__(self) -> None:
        unknown = sorted(set(self.fields) - set(TARGETS))
        if unknown:
            raise DataError(f"fields: {unknown} name no target; the targets are {list(TARGETS)} "
                            "(columns not mapped go into info)")
        if "prompt" in self.fields and "messages" in self.fields:
            raise DataError("fields: map either prompt or messages, not both (a list-valued prompt is read "
                            "as messages)")
        for target, path in self.fields.items():
            if not isinstance(path, str) or not path.strip():
                raise DataError(f"fields.{target} must name a column, got {path!r}")


def map_row(row: Any, fmap: FieldMap, where: str) -> Any:
    """``row`` in rlvr's row schema (see the module doc). A non-mapping row is returned as is, for
    :func:`~rlvr.data.tasks.to_task` to refuse with its own message."""
    if not isinstance(row, Mapping):
        return row
    out: dict[str, Any] = {}
    consumed: set[str] = set()
    prompt_target = "messages" if "messages" in fmap.fields else "prompt"
    if prompt_target == "prompt" and "prompt" not in fmap.fields and "messages" in row:
        prompt_target = "messages"
    for target in (prompt_target, "answer", "id", "info"):
        path = fmap.fields.get(target, target)
        value = _lookup(row, path)
        if value is _MISSING:
            if target in fmap.fields:
                raise DataError(f"{where}: fields.{target} = {path!r} names no column; columns: {sorted(row)}")
            continue
        if target != "answer" and path in row:  # the answer's column stays in info, as the row had it
            consumed.add(path)
        out[target] = value
    info = out.pop("info", {})
    if not isinstance(info, Mapping):
        raise DataError(f"{where}: the info column must be a mapping, got {type(info).__name__}; map another "
                        "column with fields.info, or rename it")
    merged = dict(info)
    for column, value in row.items():
        if column in consumed or value is None:
            continue
        if column in merged and merged[column] != value:
            raise DataError(f"{where}: column {column!r} and info[{column!r}] differ; rename one of them")
        merged[column] = value
    if merged:
        out["info"] = merged
    if fmap.extract is not None and out.get("answer") is not None:
        out["answer"] = extract_answer(out["answer"], fmap, where)
    return out


def fold_columns(row: Any, where: str) -> Any:
    """A row in rlvr's own schema (no ``task.fields``) with every other column moved into its ``info``,
    so each column reaches the reward by name as TRL passes it (``solution=``); a column that
    contradicts an entry of the row's own ``info`` is an error. A row that is not a mapping, or whose
    ``info`` is not one, is returned as is for :func:`~rlvr.data.tasks.to_task` to refuse."""
    if not isinstance(row, Mapping):
        return row
    extra = {column: value for column, value in row.items() if column not in TARGETS and value is not None}
    info = row.get("info") or {}
    if not extra or not isinstance(info, Mapping):
        return row
    merged = dict(info)
    for column, value in extra.items():
        if column in merged and merged[column] != value:
            raise DataError(f"{where}: column {column!r} and info[{column!r}] differ; rename one of them")
        merged[column] = value
    return {**{k: v for k, v in row.items() if k in TARGETS}, "info": merged}


def _lookup(row: Mapping[str, Any], path: str) -> Any:
    """The value at ``path``: a column of that exact name first, else a dotted path into nested ones."""
    if path in row:
        return _MISSING if row[path] is None else row[path]
    node: Any = row
    for part in path.split("."):
        if not isinstance(node, Mapping) or node.get(part) is None:
            return _MISSING
        node = node[part]
    return node


def extract_answer(answer: Any, fmap: FieldMap, where: str) -> Any:
    """The extracted gold answer; an extractor that finds nothing fails naming the row."""
    assert fmap.extract is not None
    try:
        value = fmap.extract(answer)
    except DataError as exc:
        raise DataError(f"{where}: {exc}") from None
    except Exception as exc:
        raise DataError(f"{where}: answer_extract={fmap.extract_spec!r} raised {type(exc).__name__}: {exc}") from exc
    if value is None or (isinstance(value, str) and not value.strip()):
        raise DataError(f"{where}: answer_extract={fmap.extract_spec!r} found no answer in {_short(answer)}; "
                        "fix the row, drop it from the data, or choose another extractor")
    return value


def make_extractor(spec: str | None, load: Callable[[str], Any] | None = None) -> Extractor | None:
    """The extractor ``spec`` names (see the module doc). ``load`` resolves an import path or file spec
    to a function; without it such a spec is refused (the core never imports user code itself)."""
    if spec is None:
        return None
    if spec == "####":
        return _after_hashes
    if spec == "boxed":
        return _boxed
    if spec.startswith("re:"):
        return _regex(spec[3:])
    if ":" in spec or spec.endswith(".py"):
        if load is None:
            raise DataError(f"answer_extract={spec!r}: an import path needs a loader; pass load=")
        fn = load(spec)
        if not callable(fn):
            raise DataError(f"answer_extract={spec!r} names a {type(fn).__name__}, not a function answer -> answer")
        return fn
    raise DataError(f"answer_extract={spec!r}: use '####', 'boxed', 're:PATTERN' or a function "
                    "'package.module:fn' / 'path/file.py:fn'")


def _text(answer: Any, what: str) -> str:
    if not isinstance(answer, str):
        raise DataError(f"answer_extract={what!r} needs a string answer, got {type(answer).__name__} {_short(answer)}")
    return answer


def _after_hashes(answer: Any) -> str | None:
    text = _text(answer, "####")
    if "####" not in text:
        return None
    return text.rsplit("####", 1)[1].strip().replace(",", "")


def last_boxed(text: str) -> str | None:
    """The content of the last ``\\boxed{...}`` (or ``\\fbox{...}``), nested braces kept; ``None`` if none closes."""
    start = max(text.rfind("\\boxed{"), text.rfind("\\fbox{"))
    if start < 0:
        return None
    i = text.index("{", start) + 1
    depth, begin = 1, i
    while i < len(text):
        depth += {"{": 1, "}": -1}.get(text[i], 0)
        if depth == 0:
            return text[begin:i].strip()
        i += 1
    return None


def _boxed(answer: Any) -> str | None:
    return last_boxed(_text(answer, "boxed"))


def _regex(pattern: str) -> Extractor:
    try:
        compiled = re.compile(pattern)
    except re.error as exc:
        raise DataError(f"answer_extract='re:{pattern}' is not a valid regular expression ({exc})") from None

    def extract(answer: Any) -> str | None:
        found = compiled.search(_text(answer, f"re:{pattern}"))
        if found is None:
            return None
        return (found.group(1) if compiled.groups else found.group(0)).strip()

    return extract


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."
