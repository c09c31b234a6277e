"""Read a W&B offline run's ``.wandb`` file back with W&B's own record schema.

The installed wandb ships no reader for its transaction log, so this follows the format it writes
(LevelDB's log format behind a 7-byte ``:W&B`` header: 32 KiB blocks of records, each with a
crc32, a length and a type that says whether it is whole or the first/middle/last piece) and parses
each record with ``wandb.proto.wandb_internal_pb2.Record``. Used by the tests only.
"""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any

HEADER = b":W&B"
BLOCK = 32 * 1024
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4



def records(path: Path) -> list[Any]:
    """Every record of the file, in order, as ``wandb_internal_pb2.Record`` messages."""
    from wandb.proto import wandb_internal_pb2 as pb

    data = Path(path).read_bytes()
    assert data[:4] == HEADER, f"{path}: not a W&B transaction log"
    pos, pending, payloads = 7, b"", []
    while pos + 7 <= len(data):
        left = BLOCK - pos % BLOCK
        if left < 7:  # a block's tail too short for a record header is padding
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        chunk = data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind == FULL:
            payloads.append(chunk)
        elif kind == FIRST:
            pending = chunk
        elif kind == MIDDLE:
            pending += chunk
        elif kind == LAST:
            payloads.append(pending + chunk)
        elif kind == 0 and length == 0:
            continue
        else:
            raise AssertionError(f"{path}: record type {kind} at byte {pos}")
    out = []
    for payload in payloads:
        record = pb.Record()
        record.ParseFromString(payload)
        out.append(record)
    return out


def history(path: Path) -> dict[int, dict[str, str]]:
    """``run.log`` calls by step: {step: {key: value as JSON text}}."""
    steps: dict[int, dict[str, str]] = {}
    for r in records(path):
        if r.WhichOneof("record_type") == "history":
            items = {i.key or "/".join(i.nested_key): i.value_json for i in r.history.item}
            steps.setdefault(r.history.step.num, {}).update(items)
    return steps


def config(path: Path) -> dict[str, str]:
    """The run's config keys with their values as JSON text (the last update wins)."""
    found: dict[str, str] = {}
    for r in records(path):
        kind = r.WhichOneof("record_type")
        updates = r.config.update if kind == "config" else r.run.config.update if kind == "run" else []
        for item in updates:
            found[item.key or "/".join(item.nested_key)] = item.value_json
    return found
