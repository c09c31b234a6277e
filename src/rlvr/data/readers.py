"""Rows from files, Hugging Face datasets and Python iterables, validated on the way in.

:func:`load_rows` is the one entry point. Its ``spec`` is one of:

- a path to a ``.jsonl`` (or ``.ndjson``) file: one JSON object per line, blank lines skipped;
- a ``.json`` file: a list of rows, or an object ``{"rows": [...]}`` / ``{"data": [...]}``
  (a ``.json`` file that holds one object per line is read as JSON Lines);
- a ``.csv`` file: a header row names the columns and every cell is a string, except that the
  ``messages`` and ``info`` cells hold JSON text and are decoded; an empty cell is a missing value
  (so ``answer`` stays a string, and a blank ``messages`` cell lets the row use ``prompt``);
- a ``.parquet`` file, or an Arrow IPC file or stream (``.arrow``, ``.feather``, ``.ipc``);
- a folder written by ``datasets.Dataset.save_to_disk``; a ``DatasetDict`` needs its split named
  as ``split@folder`` (``train@data/gsm8k``);
- ``split@name`` for a dataset on the Hugging Face hub (``train@openai/gsm8k``), with an optional
  config after a colon (``train@openai/gsm8k:main``); a local path of that name wins;
- an iterable of rows (or a bench with a ``questions`` list), which passes through;
- ``session:NAME``: rows this process holds in memory (:mod:`rlvr.session`, ``rlvr.train(data=...)``).

Rows in another shape (GSM8K's ``question``/``answer``, TRL's message-list ``prompt``, verl's
``reward_model.ground_truth``) are mapped by ``fields=`` (a :class:`~rlvr.data.fields.FieldMap`) before
validation. Any spec string may end in ``?limit=N`` to keep only the first N rows; the ``limit=`` argument
does the same, and when both are given the smaller wins.

Invariants:
- Every returned row has passed :func:`rlvr.data.tasks.to_task`; nothing is dropped silently. An error
  names the source, where in it (the 1-based ``line`` for JSONL and CSV, the 0-based ``row``
  index otherwise) and the field: ``data/train.jsonl line 17: field 'answer' is missing``.
- A top-level key whose value is ``None`` counts as absent: columnar formats (Parquet, Arrow,
  Hugging Face) fill a column a row lacks with nulls, and ``null`` means the same in JSON.
- Rows come back as fresh dicts, so mutating one never touches the caller's data.
- An empty source is an error, never an empty corpus.
- A row is bounded in size (``max_row_bytes``, default 8 MiB: ``task.max_row_mb``). JSONL and CSV
  lines are read at most that many bytes at a time, so an over-long line is refused before it is
  held whole; rows of other formats are measured once parsed (:func:`rlvr.data.values.row_size`).
  A non-finite answer and a NUL character anywhere in a row are refused (:mod:`rlvr.data.values`).

Imports the standard library only; ``pyarrow`` and ``datasets`` (the ``rlvr[data]`` extra) are
imported inside the readers that need them.
"""

from __future__ import annotations

import csv
import json
import operator
import os
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from itertools import islice
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl

from rlvr.data.fields import FieldMap
from rlvr.data.tasks import load_tasks, to_task
from rlvr.data.values import DEFAULT_MAX_ROW_MB, check_size, size_text
from rlvr.errors import DataError, require_extra
from rlvr.session import is_session_spec, lookup
from rlvr.types import Task

__all__ = ["SUFFIXES", "DataSpec", "load_rows", "parse_spec", "read_tasks", "spec_label"]

SUFFIXES = {".jsonl": "jsonl", ".ndjson": "jsonl", ".json": "json", ".csv": "csv",
            ".parquet": "parquet", ".arrow": "arrow", ".feather": "arrow", ".ipc": "arrow"}
CSV_JSON_COLUMNS = ("messages", "info")
DEFAULT_MAX_ROW_BYTES = int(DEFAULT_MAX_ROW_MB * 2**20)

Located = tuple[int | None, Any]  # (1-based line number, or None where rows have no lines; row)


@dataclass(frozen=True)
class DataSpec:
    """A parsed spec string: where the rows live, the split (``split@...``) and the row limit."""

    location: str
    split: str | None = None
    limit: int | None = None


def load_rows(spec: Any, *, limit: int | None = None, fields: FieldMap | None = None,
              max_row_bytes: int | None = DEFAULT_MAX_ROW_BYTES, require_answer: bool = True) -> list[dict[str, Any]]:
    """The validated rows of ``spec`` (a path, ``split@name``, or an iterable; see the module doc),
    as read (``fields`` maps them only for validation: :func:`read_tasks` gives the mapped rows).
    A row over ``max_row_bytes`` (``None``: no bound) is refused; see the module doc.

    Raises :class:`DataError` naming the source, line or row, and field of the first bad row, and
    :class:`MissingExtraError` naming ``rlvr[data]`` when Parquet, Arrow or Hugging Face input
    needs a package that is not installed.
    """
    return _read(spec, limit, fields, max_row_bytes, require_answer)[0]


def read_tasks(spec: Any, *, limit: int | None = None, fields: FieldMap | None = None,
               max_row_bytes: int | None = DEFAULT_MAX_ROW_BYTES, require_answer: bool = True) -> list[Task]:
    """:func:`load_rows` as tasks: each row mapped by ``fields`` (:mod:`rlvr.data.fields`) and validated
    once, where its line is known, with ids made unique as :func:`~rlvr.data.tasks.load_tasks` does.
    What a run trains and holds out on. ``require_answer=False`` lets a row without ``answer`` through
    (prompt-only data, for rewards that take no answer)."""
    return load_tasks(_read(spec, limit, fields, max_row_bytes, require_answer)[1])


def _read(spec: Any, limit: int | None, fields: FieldMap | None = None,
          max_row_bytes: int | None = DEFAULT_MAX_ROW_BYTES,
          require_answer: bool = True) -> tuple[list[dict[str, Any]], list[Task]]:
    n = None if limit is None else _positive(limit, "limit")
    if is_session_spec(spec):  # rows held in memory by this process (rlvr.train(data=...))
        return _validated(_iterable_rows(lookup(spec)), spec, n, fields, max_row_bytes, require_answer)
    if isinstance(spec, os.PathLike):
        spec = DataSpec(os.fspath(spec))
    elif isinstance(spec, str):
        spec = parse_spec(spec)
    elif not isinstance(spec, DataSpec):
        return _validated(_iterable_rows(spec), "bench", n, fields, max_row_bytes, require_answer)
    if spec.limit is not None:
        n = min(n or spec.limit, _positive(spec.limit, "DataSpec.limit"))
    label, located = _open(spec, n, max_row_bytes)
    return _validated(located, label, n, fields, max_row_bytes, require_answer)


def parse_spec(spec: str) -> DataSpec:
    """Split ``[split@]location[?limit=N]``; an existing path is taken whole, ``@`` and ``?`` too."""
    text, limit = spec, None
    if "?" in text and not _exists(text):
        text, query = text.rsplit("?", 1)
        limit = _query_limit(query, spec)
    if not text.strip():
        raise DataError(f"data spec {spec!r} names no file, folder or dataset")
    if "@" not in text or _exists(text):
        return DataSpec(text, None, limit)
    split, location = text.split("@", 1)
    if not split or not location:
        raise DataError(f"data spec {spec!r}: write split@name, e.g. 'train@openai/gsm8k'")
    return DataSpec(location, split, limit)


def spec_label(spec: str) -> str:
    """``spec`` as a record that travels names it: rows held in memory as such, a local file or folder by
    its name alone (never a path of this machine), a hub dataset as given (``train@openai/gsm8k``)."""
    if is_session_spec(spec):
        return "in-memory rows (rlvr.train(data=...))"
    try:
        parsed = parse_spec(spec)
    except DataError:
        return spec
    local = Path(parsed.location).expanduser()
    where = local.name if local.is_absolute() or _exists(parsed.location) else parsed.location
    return (f"{parsed.split}@" if parsed.split else "") + where + (f"?limit={parsed.limit}" if parsed.limit else "")


def _exists(text: str) -> bool:
    return Path(text).expanduser().exists()


def _query_limit(query: str, spec: str) -> int:
    try:
        pairs = parse_qsl(query, keep_blank_values=True, strict_parsing=True)
    except ValueError:
        pairs = []
    if len(pairs) != 1 or pairs[0][0] != "limit":
        raise DataError(f"data spec {spec!r}: the only option after '?' is limit=N (a positive integer)")
    value = pairs[0][1]
    return _positive(int(value) if value.isascii() and value.isdigit() else value, f"{spec!r}: limit")


def _positive(value: Any, what: str) -> int:
    try:
        n = None if isinstance(value, bool) else operator.index(value)
    except TypeError:
        n = None
    if n is None or n < 1:
        raise DataError(f"{what} must be a positive integer, got {value!r}")
    return n


def _validated(located: Iterable[Located], label: str, limit: int | None, fields: FieldMap | None = None,
               max_row_bytes: int | None = DEFAULT_MAX_ROW_BYTES,
               require_answer: bool = True) -> tuple[list[dict[str, Any]], list[Task]]:
    """Each row and its :func:`to_task`; errors name the line where the format has lines."""
    rows: list[dict[str, Any]] = []
    tasks: list[Task] = []
    for index, (line, row) in enumerate(islice(located, limit)):
        where = f"{label} row {index}" if line is None else f"{label} line {line}"
        check_size(row, max_row_bytes, where)  # formats without lines: once parsed, before any use
        if isinstance(row, Mapping):
            row = {key: value for key, value in row.items() if value is not None}
        tasks.append(to_task(row, index, label, where=None if line is None else where, fields=fields,
                             require_answer=require_answer))
        rows.append(row)
    if not rows:
        raise DataError(f"{label}: no rows to load; a corpus needs at least one row")
    return rows, tasks


def _iterable_rows(obj: Any) -> Iterator[Located]:
    rows = getattr(obj, "questions", obj)
    if isinstance(rows, (bytes, bytearray, Mapping)) or not isinstance(rows, Iterable):
        raise DataError("load_rows needs a path, a 'split@name' spec or an iterable of rows, "
                        f"got {type(obj).__name__}")
    return ((None, row) for row in rows)


def _open(spec: DataSpec, limit: int | None, max_bytes: int | None) -> tuple[str, Iterator[Located]]:
    """The label errors should carry, and the located rows of ``spec``."""
    path = Path(spec.location).expanduser()
    label = spec.location if spec.split is None else f"{spec.split}@{spec.location}"
    if path.is_dir():
        return label, _disk_rows(spec.location, spec.split, label, limit)
    if spec.split is not None:
        if path.exists():
            raise DataError(f"{label}: a split applies to a Hugging Face dataset, not to a file; "
                            f"write {spec.location!r}")
        return label, _hub_rows(spec.location, spec.split, label, limit)
    if not path.exists():
        hint = "" if path.suffix.lower() in SUFFIXES else f" (for a Hugging Face hub dataset write 'train@{label}')"
        raise DataError(f"{label}: no such file or folder{hint}")
    kind = SUFFIXES.get(path.suffix.lower())
    if kind is None:
        raise DataError(f"{label}: cannot read {path.suffix or 'suffix-less'!r} files; use one of "
                        f"{', '.join(SUFFIXES)}, a Hugging Face dataset folder, or split@name")
    if path.stat().st_size == 0:
        raise DataError(f"{label}: the file is empty; a corpus needs at least one row")
    return label, READERS[kind](path, label, max_bytes)


# --- text formats -----------------------------------------------------------------------------


def _lines(path: Path, label: str, max_bytes: int | None = None) -> Iterator[str]:
    """The file's lines, each decoded as UTF-8 on its own so a bad byte is pinned to its line. A line
    over ``max_bytes`` is refused once that many bytes of it are read: it is never held whole."""
    with path.open("rb") as f:
        for number, raw in enumerate(iter(lambda: f.readline(-1 if max_bytes is None else max_bytes + 2), b""),
                                     start=1):
            if max_bytes is not None and len(raw.rstrip(b"\r\n")) > max_bytes:
                raise DataError(f"{label} line {number}: longer than {size_text(max_bytes)} (task.max_row_mb); a "
                                "row this large cannot be a prompt the model takes: drop it, or raise "
                                "task.max_row_mb for rows with large info")
            try:
                yield raw.decode("utf-8-sig" if number == 1 else "utf-8")
            except UnicodeDecodeError as exc:
                raise DataError(f"{label} line {number}: not UTF-8 text ({exc.reason} at byte "
                                f"{exc.start})") from None


def _decode(text: str, prefix: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise DataError(f"{prefix}not valid JSON ({exc.msg} at column {exc.colno})") from None
    except (ValueError, RecursionError) as exc:  # a huge integer literal, or nesting too deep
        raise DataError(f"{prefix}not valid JSON ({exc})") from None


def _jsonl_rows(path: Path, label: str, max_bytes: int | None = None) -> Iterator[Located]:
    for number, text in enumerate(_lines(path, label, max_bytes), start=1):
        if text.strip():
            yield number, _decode(text, f"{label} line {number}: ")


def _json_rows(path: Path, label: str, max_bytes: int | None = None) -> Iterator[Located]:
    # One JSON value, often written on one line: read whole, each row's size checked once parsed.
    try:
        data = json.loads("".join(_lines(path, label)))
    except json.JSONDecodeError as exc:
        if exc.msg == "Extra data":  # one value per line: JSON Lines under a .json name
            yield from _jsonl_rows(path, label, max_bytes)
            return
        raise DataError(f"{label} line {exc.lineno} column {exc.colno}: not valid JSON "
                        f"({exc.msg})") from None
    except (ValueError, RecursionError) as exc:
        raise DataError(f"{label}: not valid JSON ({exc})") from None
    if isinstance(data, dict):
        data = data["rows"] if "rows" in data else data.get("data")
    if not isinstance(data, list):
        raise DataError(f"{label}: a .json file must hold a list of rows, or an object with a "
                        f"'rows' or 'data' list")
    yield from ((None, row) for row in data)


def _csv_rows(path: Path, label: str, max_bytes: int | None = None) -> Iterator[Located]:
    reader = csv.reader(_lines(path, label, max_bytes), strict=True)  # an unterminated quote is an error, not a cell
    header: list[str] | None = None
    end = 0  # the last line of the previous record: a quoted cell may span lines
    try:
        for record in reader:
            start, end = end + 1, reader.line_num
            if not record:
                continue
            where = f"{label} line {start}"
            if header is None:
                header = [name.strip() for name in record]
                twice = sorted({name for name in header if header.count(name) > 1})
                if twice:
                    raise DataError(f"{where}: the header names the column {twice[0]!r} twice")
            elif len(record) > len(header):
                raise DataError(f"{where}: {len(record)} cells, but the header names "
                                f"{len(header)} columns")
            else:
                # a short record leaves its trailing columns missing, as empty cells would
                yield start, _csv_row(dict(zip(header, record, strict=False)), where)
    except csv.Error as exc:
        hint = "; a quote opened on or after this line is never closed" if "end of data" in str(exc) else ""
        raise DataError(f"{label} line {end + 1}: not valid CSV ({exc}){hint}") from None


def _csv_row(cells: dict[str, str], where: str) -> dict[str, Any]:
    row: dict[str, Any] = {name: cell for name, cell in cells.items() if cell != ""}
    for name in CSV_JSON_COLUMNS:
        if name in row:
            row[name] = _decode(row[name], f"{where}: field {name!r} is ")
    return row


# --- columnar formats (pyarrow) -----------------------------------------------------------------


def _batch_rows(batches: Iterable[Any]) -> Iterator[Located]:
    for batch in batches:
        yield from ((None, row) for row in batch.to_pylist())


def _parquet_rows(path: Path, label: str, max_bytes: int | None = None) -> Iterator[Located]:
    require_extra("data", "pyarrow")
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        yield from _batch_rows(pq.ParquetFile(path).iter_batches())
    except (pa.ArrowException, OSError) as exc:
        raise DataError(f"{label}: not a readable Parquet file ({exc})") from None


def _arrow_rows(path: Path, label: str, max_bytes: int | None = None) -> Iterator[Located]:
    require_extra("data", "pyarrow")
    import pyarrow as pa

    try:
        with pa.memory_map(str(path)) as source:
            try:
                reader = pa.ipc.open_file(source)
                batches: Iterable[Any] = (reader.get_batch(i) for i in range(reader.num_record_batches))
            except pa.ArrowInvalid:  # not the file format: try the stream format
                source.seek(0)
                batches = pa.ipc.open_stream(source)
            yield from _batch_rows(batches)
    except (pa.ArrowException, OSError) as exc:
        raise DataError(f"{label}: not a readable Arrow IPC file or stream ({exc})") from None


# --- Hugging Face datasets ----------------------------------------------------------------------


def _dataset_rows(dataset: Any, limit: int | None) -> Iterator[Located]:
    if limit is not None and limit < len(dataset):
        dataset = dataset.select(range(limit))
    return ((None, row) for row in dataset.to_list())


def _disk_rows(folder: str, split: str | None, label: str, limit: int | None) -> Iterator[Located]:
    require_extra("data", "datasets")
    import datasets

    try:
        loaded = datasets.load_from_disk(str(Path(folder).expanduser()))
    except (OSError, ValueError) as exc:
        raise DataError(f"{label}: not a dataset folder written by save_to_disk ({exc})") from None
    if isinstance(loaded, datasets.DatasetDict):
        if split is None or split not in loaded:
            asked = "needs a split" if split is None else f"has no split {split!r}"
            raise DataError(f"{label}: this DatasetDict {asked}; write SPLIT@{folder} with SPLIT "
                            f"one of {sorted(loaded)}")
        loaded = loaded[split]
    elif split is not None and loaded.split is not None and str(loaded.split) != split:
        raise DataError(f"{label}: this folder holds only the {str(loaded.split)!r} split")
    return _dataset_rows(loaded, limit)


def _hub_rows(name: str, split: str, label: str, limit: int | None) -> Iterator[Located]:
    require_extra("data", "datasets")
    import datasets

    repo, _, config = name.partition(":")
    try:
        loaded = datasets.load_dataset(repo, config or None, split=split)
    except Exception as exc:  # the hub client raises many types: network, auth, unknown split...
        raise DataError(f"{label}: could not load the Hugging Face dataset "
                        f"({type(exc).__name__}: {exc})") from exc
    return _dataset_rows(loaded, limit)


READERS = {"jsonl": _jsonl_rows, "json": _json_rows, "csv": _csv_rows,
           "parquet": _parquet_rows, "arrow": _arrow_rows}
