"""A model folder's fingerprint: the names, sizes and SHA-256 of the files its weights load from, and
what changed between two fingerprints.

The files are the folder's own weight files (``*.safetensors``, ``*.bin``, ``*.pt``, ``*.gguf``) and
its ``config.json``, at the top of the folder, where transformers loads them from::

    {"format": 1, "files": {"config.json": {"bytes": 612, "sha256": "..."}, "model.safetensors": {...}}}

Changing which files count changes what a fingerprint means: it takes a new ``FORMAT``.

Hashing a 7B base reads ~15 GB, so each file's hash is kept in one cache file per user,
``fingerprints.json`` in the cache folder (``$RLVR_CACHE``, else ``$XDG_CACHE_HOME/rlvr``, else
``~/.cache/rlvr``), keyed by the file's resolved path, size, ``mtime_ns``, ``ctime_ns`` and inode. Any
write to a file changes its mtime and ctime, and setting the mtime back changes the ctime again, so
a file written since it was hashed is hashed again. A file that changed while it was being hashed is
not cached. The cache only saves time: one that cannot be read is taken as empty, one that cannot be
written is not kept, and two processes writing it at once lose only entries (hashed again later).
Standard library only.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rlvr.backends.model.sources import default_cache_dir
from rlvr.seeding import file_sha256

FORMAT = 1
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".gguf")
CONFIG_FILE = "config.json"
CACHE_FILE = "fingerprints.json"
SAID_ABOVE = 1 << 30  # uncached bytes worth a line before hashing them (a 1 GiB read takes seconds)
SHOWN = 3  # differences named in one line; the rest are counted


def fingerprinted_files(folder: Path) -> list[Path]:
    """The files of ``folder`` a fingerprint covers, by name."""
    return sorted(p for p in folder.iterdir() if p.is_file() and (
        p.name == CONFIG_FILE or p.suffix.lower() in WEIGHT_SUFFIXES))


def fingerprint(folder: str | Path, *, cache_dir: str | Path | None = None,
                say: Callable[[str], None] | None = None) -> dict[str, Any]:
    """The fingerprint of ``folder`` (see the module doc); hashes come from the cache where it holds them."""
    folder = Path(folder).expanduser()
    cache_path = Path(cache_dir if cache_dir is not None else default_cache_dir()) / CACHE_FILE
    cache = _read_cache(cache_path)
    files: dict[str, dict[str, Any]] = {}
    fresh: dict[str, dict[str, Any]] = {}
    todo = []
    for path in fingerprinted_files(folder):
        key, stamp = _stamp(path)
        hit = cache.get(key)
        if isinstance(hit, dict) and {k: hit.get(k) for k in stamp} == stamp and isinstance(hit.get("sha256"), str):
            files[path.name] = {"bytes": stamp["bytes"], "sha256": hit["sha256"]}
        else:
            todo.append((path, key, stamp))
    uncached = sum(stamp["bytes"] for _, _, stamp in todo)
    if say is not None and uncached >= SAID_ABOVE:
        say(f"base: hashing {uncached / 2**30:.1f} GiB of weights in {folder} once (a resume checks them against "
            f"this; the hashes are kept in {cache_path})")
    for path, key, stamp in todo:
        digest = file_sha256(path)
        files[path.name] = {"bytes": stamp["bytes"], "sha256": digest}
        if _stamp(path)[1] == stamp:  # not written while it was read: the hash is the file's
            fresh[key] = {**stamp, "sha256": digest}
    if fresh:
        _write_cache(cache_path, {**cache, **fresh})
    return {"format": FORMAT, "files": dict(sorted(files.items()))}


def differences(then: dict[str, Any], now: dict[str, Any]) -> list[str]:
    """What changed from fingerprint ``then`` to ``now``, one phrase per file (empty: nothing)."""
    before, after = then.get("files") or {}, now.get("files") or {}
    out = []
    for name in sorted(before.keys() | after.keys()):
        was, iss = before.get(name), after.get(name)
        if was is None:
            assert iss is not None  # the name is on one side at least
            out.append(f"{name} was added ({iss['bytes']} bytes)")
        elif iss is None:
            out.append(f"{name} was removed")
        elif was.get("bytes") != iss["bytes"]:
            out.append(f"{name} is {iss['bytes']} bytes, {was.get('bytes')} then")
        elif was.get("sha256") != iss["sha256"]:
            out.append(f"{name} changed content (sha256 {str(was.get('sha256'))[:12]}… then, "
                       f"{iss['sha256'][:12]}… now)")
    return out


def difference_text(changes: list[str]) -> str:
    """``changes`` for one line: the first few, and how many more."""
    shown = "; ".join(changes[:SHOWN])
    return shown + (f"; and {len(changes) - SHOWN} more" if len(changes) > SHOWN else "")


def _stamp(path: Path) -> tuple[str, dict[str, int]]:
    st = os.stat(path)
    return str(path.resolve()), {"bytes": st.st_size, "mtime_ns": st.st_mtime_ns, "ctime_ns": st.st_ctime_ns,
                                 "inode": st.st_ino}


def _read_cache(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    entries = data.get("files") if isinstance(data, dict) and data.get("format") == FORMAT else None
    return entries if isinstance(entries, dict) else {}


def _write_cache(path: Path, entries: dict[str, Any]) -> None:
    kept = {k: v for k, v in entries.items() if os.path.exists(k)}  # files gone (a deleted run's base/) dropped
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump({"format": FORMAT, "files": kept}, f, indent=1, sort_keys=True)
            os.replace(tmp, path)
        finally:
            Path(tmp).unlink(missing_ok=True)
    except OSError:
        pass  # a read-only cache: the hashes are computed again next time, nothing else is lost
