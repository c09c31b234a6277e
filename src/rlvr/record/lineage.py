"""What a model folder rlvr wrote was trained on, and the refusal to hold out rows a run's base has seen.

Every folder rlvr writes that a later run can start from records the rows its weights were trained
on, as short split keys of their normal form (:mod:`rlvr.data.normal`), in ``rlvr_lineage.json``::

    {"format": 1, "trained_on": [key, ...], "train": [key, ...], "heldout": [key, ...]}

- a run folder: its training rows (``train``), those and everything its start had seen
  (``trained_on``), and its held-out rows (``heldout``); its checkpoints
  (``checkpoints/step_N/trainer``) are found by walking up;
- a warm-started ``base/``: the training rows it was fine-tuned on (and what its own start had seen);
- an export (the folder, its ``adapter/`` and ``merged/``): the run's ``trained_on``.

Before anything is written, :func:`check_lineage` looks up ``model.base`` and ``model.adapter_init``:
one trained on any of the new run's held-out rows is refused, naming how many and a few ids, unless
``model.allow_heldout_overlap = true``; either way run.json records ``heldout_overlap``. A folder
rlvr wrote before lineage files existed records only its split's hashes (``rlvr_base.json``, a run's
``run.json``): the same split passes; another is refused as an overlap that cannot be counted.
Part of the composition root; standard library + rlvr core only.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlvr.config.run import RunConfig
from rlvr.data.normal import overlap, short_keys
from rlvr.errors import ConfigError
from rlvr.record.run_record import disk_errors, write_json_atomic
from rlvr.types import Split

LINEAGE_FILE = "rlvr_lineage.json"
FORMAT = 1
SEARCH_UP = 4  # checkpoints/step_N/trainer/adapter -> the run folder
SHOWN_IDS = 5


@dataclass(frozen=True)
class Lineage:
    """What the folder ``where`` records: the keys of the rows it was trained on, or, for a folder
    written before lineage files, only its split's hashes (``split``)."""

    where: Path
    trained_on: frozenset[str] | None
    split: dict[str, Any] | None = None


def find_lineage(spec: str) -> Lineage | None:
    """The lineage of the local folder ``spec`` names (itself or a folder above it), if rlvr wrote it."""
    start = Path(spec).expanduser()
    if not start.exists():
        return None  # a hub name, or a GGUF spec: not written by rlvr
    start = start if start.is_dir() else start.parent
    for folder in [start, *start.parents][: SEARCH_UP + 1]:
        found = _read(folder)
        if found is not None:
            return found
    return None


def _read(folder: Path) -> Lineage | None:
    path = folder / LINEAGE_FILE
    if path.is_file():
        data = _json(path)
        keys = data.get("trained_on") if data else None
        if not isinstance(keys, list):
            raise ConfigError(f"{path} cannot be read as a lineage file; remove it only if that folder was not "
                              "trained by rlvr")
        return Lineage(folder, frozenset(map(str, keys)))
    for marker, key in (("rlvr_base.json", None), ("run.json", "split")):  # written before lineage files
        data = _json(folder / marker) if (folder / marker).is_file() else None
        split = data.get(key) if data and key else data
        if isinstance(split, dict) and "train_hash" in split:
            return Lineage(folder, None, split)
    return None


def _json(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


@dataclass
class StartLineage:
    """What a run starts from, as :func:`check_lineage` found it: ``record`` (run.json's
    ``heldout_overlap``, empty when rlvr wrote neither folder) and ``inherited`` (the keys its start
    was trained on, which the run's own lineage carries on)."""

    split: Split
    fine_tuned: bool
    record: dict[str, Any]
    inherited: frozenset[str]

    def write(self, run_dir: Path, base: Path) -> None:
        """The run folder's lineage file, and its warm-started ``base/``'s when it has one."""
        write_lineage(run_dir, lineage_of_run(self.split, self.inherited))
        if base.parent == run_dir:
            write_lineage(base, lineage_of_base(self.split, self.inherited, self.fine_tuned))

    def run_info(self) -> dict[str, Any]:
        return {"heldout_overlap": self.record} if self.record else {}


def check_lineage(cfg: RunConfig, split: Split) -> StartLineage:
    """``model.base`` and ``model.adapter_init`` checked against ``split.heldout`` (see the module doc);
    refuses an overlap unless ``model.allow_heldout_overlap``. Reads only: nothing is written."""
    allowed = cfg.model.allow_heldout_overlap
    record: dict[str, Any] = {}
    inherited: set[str] = set()
    for field, spec in (("model.base", cfg.model.base), ("model.adapter_init", cfg.model.adapter_init)):
        lineage = find_lineage(spec) if spec else None
        if lineage is None:
            continue
        entry, seen = _overlap(field, spec, lineage, split, allowed)  # type: ignore[arg-type]
        record[field] = entry
        inherited |= seen
    if record:
        record["allowed"] = allowed
    return StartLineage(split, cfg.sft.steps > 0, record, frozenset(inherited))


def _overlap(field: str, spec: str, lineage: Lineage, split: Split, allowed: bool) -> tuple[dict[str, Any], set[str]]:
    hint = ("set model.allow_heldout_overlap = true to use it anyway (its held-out score is then not a fair "
            "measure), or start from a base that never saw these rows")
    if lineage.trained_on is None:
        same = lineage.split is not None and (lineage.split.get("train_hash"), lineage.split.get("heldout_hash")) == (
            split.manifest["train_hash"], split.manifest["heldout_hash"])
        entry = {"folder": str(lineage.where), "counted": False, "same_split": same}
        if not same and not allowed:
            raise ConfigError(f"{field}={spec!r} was trained by rlvr on another split of rows ({lineage.where} records "
                              "only that split's hashes, not its rows), so how many of this run's held-out rows it "
                              f"saw cannot be counted; {hint}")
        return entry, set()
    seen = overlap(split.heldout, lineage.trained_on)
    ids = [t.id for t in seen[:SHOWN_IDS]]
    entry = {"folder": str(lineage.where), "counted": True, "trained_on": len(lineage.trained_on),
             "heldout_rows_seen": len(seen), "heldout_ids_seen": ids}
    if seen and not allowed:
        raise ConfigError(f"{field}={spec!r} was trained on {len(seen)} of this run's {len(split.heldout)} held-out "
                          f"rows (e.g. {ids}; by {lineage.where / LINEAGE_FILE}): held-out scores would measure "
                          f"memory; {hint}")
    return entry, set(lineage.trained_on)


def lineage_of_run(split: Split, inherited: Iterable[str]) -> dict[str, Any]:
    """A run folder's lineage: its training rows and what its start had seen; its held-out rows."""
    train = short_keys(split.train)
    return {"format": FORMAT, "trained_on": sorted(set(train) | set(inherited)), "train": train,
            "heldout": short_keys(split.heldout)}


def run_keys(run_dir: Path) -> dict[str, list[str]] | None:
    """A run folder's ``train``, ``heldout`` and ``trained_on`` keys (``None``: no lineage file)."""
    data = _json(run_dir / LINEAGE_FILE)
    if data is None or not all(isinstance(data.get(k), list) for k in ("train", "heldout", "trained_on")):
        return None
    return {k: data[k] for k in ("train", "heldout", "trained_on")}


def lineage_of_base(split: Split, inherited: Iterable[str], fine_tuned: bool) -> dict[str, Any]:
    """A warm-started base's lineage: the training rows when it was fine-tuned, and what its start had seen."""
    own = set(short_keys(split.train)) if fine_tuned else set()
    return {"format": FORMAT, "trained_on": sorted(own | set(inherited))}


def write_lineage(folder: Path, lineage: dict[str, Any]) -> None:
    with disk_errors(f"{folder / LINEAGE_FILE}"):
        write_json_atomic(folder / LINEAGE_FILE, lineage)


def copy_lineage(run_dir: Path, *folders: Path) -> None:
    """An export's folders inherit the run's ``trained_on`` (nothing, for a run from before lineage files)."""
    data = _json(run_dir / LINEAGE_FILE)
    if data is None:
        return
    for folder in folders:
        write_lineage(folder, {"format": FORMAT, "trained_on": data.get("trained_on", [])})
