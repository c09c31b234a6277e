"""What a model folder rlvr wrote was trained on, and the refusal to hold out rows a run's base has seen.

Every folder rlvr writes that a later run can start from records the rows its weights were trained
on, in ``rlvr_lineage.json`` (format 2)::

    {"format": 2, "trained_on": [key, ...], "train": [key, ...], "heldout": [key, ...],
     "near": {"train": PART, "heldout": PART, "inherited": [PART, ...]}}

- keys are short split keys of the rows' normal prompts (:mod:`rlvr.data.normal`); a ``PART`` is what
  the near-duplicate check needs of a set of rows, as hashes (:mod:`rlvr.data.fingerprints`);
- a run folder: its training rows (``train``), those and everything its start had seen
  (``trained_on``; ``near.inherited`` the start's parts), and its held-out rows (``heldout``); its
  checkpoints (``checkpoints/step_N/trainer``) are found by walking up;
- a warm-started ``base/``: the training rows it was fine-tuned on (and what its own start had seen),
  ``near.trained_on`` their parts;
- an export (the folder, its ``adapter/`` and ``merged/``): the run's ``trained_on``.

Format 1 (written before near-duplicates were checked) keyed each row by prompt and answer
(:mod:`rlvr.data.normal_v1`): its keys are still read and compared the same way, and carried on as
``trained_on_v1``. Before anything is written, :func:`check_lineage` looks up ``model.base`` and
``model.adapter_init``: one trained on any of the new run's held-out rows, or on a near-duplicate of
one, is refused, naming how many and a few ids, unless ``model.allow_heldout_overlap = true``; either
way run.json records ``heldout_overlap``. A folder rlvr wrote before lineage files existed records
only its split's hashes (``rlvr_base.json``, a run's ``run.json``): the same split passes; another is
refused as an overlap that cannot be counted.
Part of the composition root; standard library + rlvr core only.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlvr.config.run import RunConfig
from rlvr.data.fingerprints import Part, near_matches, parts_of
from rlvr.data.normal import SHORT_KEY, short_keys, split_key
from rlvr.data.normal_v1 import row_key
from rlvr.errors import ConfigError
from rlvr.record.run_record import disk_errors, write_json_atomic
from rlvr.types import Split, Task

LINEAGE_FILE = "rlvr_lineage.json"
FORMAT = 2
SEARCH_UP = 4  # checkpoints/step_N/trainer/adapter -> the run folder
SHOWN_IDS = 5


@dataclass(frozen=True)
class Lineage:
    """What the folder ``where`` records: the keys of the rows it was trained on (``trained_on``;
    ``legacy``, format-1 keys) and their near-duplicate parts (``near``, as JSON), or, for a folder
    written before lineage files, only its split's hashes (``split``)."""

    where: Path
    trained_on: frozenset[str] | None
    split: dict[str, Any] | None = None
    legacy: frozenset[str] = frozenset()
    near: tuple[dict[str, Any], ...] = ()

    def seen(self, tasks: Sequence[Task]) -> tuple[list[Task], int]:
        """The tasks this folder was trained on (the same prompt, or a near-duplicate of one), and how
        many of them only as a near-duplicate."""
        keys = self.trained_on or frozenset()
        exact = [split_key(t)[:SHORT_KEY] in keys or (bool(self.legacy) and row_key(t)[:SHORT_KEY] in self.legacy)
                 for t in tasks]
        near = near_matches(tasks, parts_of(list(self.near)))
        return [t for t, e, n in zip(tasks, exact, near, strict=True) if e or n], sum(
            1 for e, n in zip(exact, near, strict=True) if n and not e)


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
        if data is None or not isinstance(keys, list):
            raise ConfigError(f"{path} cannot be read as a lineage file; remove it only if that folder was not "
                              "trained by rlvr")
        if data.get("format", 1) == 1:  # keys of the rule before: prompt and answer
            return Lineage(folder, frozenset(), legacy=frozenset(map(str, keys)))
        return Lineage(folder, frozenset(map(str, keys)), legacy=frozenset(map(str, data.get("trained_on_v1", []))),
                       near=tuple(near_trained_on(data)))
    for marker, key in (("rlvr_base.json", None), ("run.json", "split")):  # written before lineage files
        data = _json(folder / marker) if (folder / marker).is_file() else None
        split = data.get(key) if data and key else data
        if isinstance(split, dict) and "train_hash" in split:
            return Lineage(folder, None, split)
    return None


def near_trained_on(data: dict[str, Any]) -> list[dict[str, Any]]:
    """The parts of the rows a lineage file's folder was trained on."""
    near = data.get("near")
    if not isinstance(near, dict):
        return []
    if "train" in near:  # a run folder: its training rows and what its start had seen
        return [near["train"], *near.get("inherited", [])]
    return [p for p in near.get("trained_on", []) if isinstance(p, dict)]


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
    inherited_legacy: frozenset[str] = frozenset()
    inherited_near: tuple[dict[str, Any], ...] = ()

    def write(self, run_dir: Path, base: Path) -> None:
        """The run folder's lineage file, and its warm-started ``base/``'s when it has one."""
        train = Part.of(self.split.train).to_json()
        write_lineage(run_dir, lineage_of_run(self.split, self, train))
        if base.parent == run_dir:
            write_lineage(base, lineage_of_base(self.split, self, self.fine_tuned, train))

    def run_info(self) -> dict[str, Any]:
        return {"heldout_overlap": self.record} if self.record else {}


def check_lineage(cfg: RunConfig, split: Split) -> StartLineage:
    """``model.base`` and ``model.adapter_init`` checked against ``split.heldout`` (see the module doc);
    refuses an overlap unless ``model.allow_heldout_overlap``. Reads only: nothing is written."""
    allowed = cfg.model.allow_heldout_overlap
    record: dict[str, Any] = {}
    inherited: set[str] = set()
    legacy: set[str] = set()
    near: list[dict[str, Any]] = []
    for field, spec in (("model.base", cfg.model.base), ("model.adapter_init", cfg.model.adapter_init)):
        lineage = find_lineage(spec) if spec else None
        if lineage is None:
            continue
        record[field] = _overlap(field, spec, lineage, split, allowed)  # type: ignore[arg-type]
        inherited |= lineage.trained_on or set()
        legacy |= lineage.legacy
        near.extend(p for p in lineage.near if p not in near)
    if record:
        record["allowed"] = allowed
    return StartLineage(split, cfg.sft.steps > 0, record, frozenset(inherited), frozenset(legacy), tuple(near))


def _overlap(field: str, spec: str, lineage: Lineage, split: Split, allowed: bool) -> dict[str, Any]:
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
        return entry
    seen, near = lineage.seen(split.heldout)
    ids = [t.id for t in seen[:SHOWN_IDS]]
    entry = {"folder": str(lineage.where), "counted": True,
             "trained_on": len(lineage.trained_on) + len(lineage.legacy),
             "heldout_rows_seen": len(seen), "heldout_ids_seen": ids, "near_duplicates_seen": near}
    if seen and not allowed:
        twins = f"; {near} of them as near-duplicates" if near else ""
        raise ConfigError(f"{field}={spec!r} was trained on {len(seen)} of this run's {len(split.heldout)} held-out "
                          f"rows (e.g. {ids}{twins}; by {lineage.where / LINEAGE_FILE}): held-out scores would measure "
                          f"memory; {hint}")
    return entry


def lineage_of_run(split: Split, start: StartLineage, train_part: dict[str, Any]) -> dict[str, Any]:
    """A run folder's lineage: its training rows and what its start had seen; its held-out rows."""
    train = short_keys(split.train)
    return {"format": FORMAT, "trained_on": sorted(set(train) | start.inherited), "train": train,
            "heldout": short_keys(split.heldout),
            **({"trained_on_v1": sorted(start.inherited_legacy)} if start.inherited_legacy else {}),
            "near": {"train": train_part, "heldout": Part.of(split.heldout).to_json(),
                     "inherited": list(start.inherited_near)}}


def run_keys(run_dir: Path) -> dict[str, Any] | None:
    """A run folder's ``train``, ``heldout`` and ``trained_on`` keys (``None``: no lineage file), with
    ``legacy`` (format-1 keys: of prompt and answer) and ``near`` (each side's parts, as JSON)."""
    data = _json(run_dir / LINEAGE_FILE)
    if data is None or not all(isinstance(data.get(k), list) for k in ("train", "heldout", "trained_on")):
        return None
    near: dict[str, Any] = data["near"] if isinstance(data.get("near"), dict) else {}
    return {**{k: data[k] for k in ("train", "heldout", "trained_on")}, "legacy": data.get("format", 1) == 1,
            "trained_on_v1": data.get("trained_on_v1", []),
            "near": {"train": [near["train"]] if "train" in near else [],
                     "heldout": [near["heldout"]] if "heldout" in near else [],
                     "trained_on": near_trained_on(data)}}


def lineage_of_base(split: Split, start: StartLineage, fine_tuned: bool, train_part: dict[str, Any]) -> dict[str, Any]:
    """A warm-started base's lineage: the training rows when it was fine-tuned, and what its start had seen."""
    own = set(short_keys(split.train)) if fine_tuned else set()
    return {"format": FORMAT, "trained_on": sorted(own | start.inherited),
            **({"trained_on_v1": sorted(start.inherited_legacy)} if start.inherited_legacy else {}),
            "near": {"trained_on": ([train_part] if fine_tuned else []) + list(start.inherited_near)}}


def write_lineage(folder: Path, lineage: dict[str, Any]) -> None:
    with disk_errors(f"{folder / LINEAGE_FILE}"):
        write_json_atomic(folder / LINEAGE_FILE, lineage)


def copy_lineage(run_dir: Path, *folders: Path) -> None:
    """An export's folders inherit the run's ``trained_on`` (nothing, for a run from before lineage files)."""
    data = _json(run_dir / LINEAGE_FILE)
    if data is None:
        return
    for folder in folders:
        write_lineage(folder, {"format": data.get("format", 1), "trained_on": data.get("trained_on", []),
                               **({"trained_on_v1": data["trained_on_v1"]} if "trained_on_v1" in data else {}),
                               **({"near": {"trained_on": near_trained_on(data)}} if "near" in data else {})})
