"""The base a run's checkpoints apply to, recorded when the run begins and checked before they are used again.

A checkpoint holds what training changed (a LoRA adapter, or the trained weights over the base's
other buffers), so it means something only over the base it was trained on. run.json records:

- ``base_source``: ``model.base`` as given and as loaded; for a GGUF file, the file's SHA-256;
- ``base_fingerprint``: for a base that is a folder on this machine (``model.base`` given as a
  folder, or the run's own ``base/``, built or warm-started), its weight files' names, sizes and
  hashes (:mod:`rlvr.backends.model.fingerprint`, cached so a start does not read a 7B base again).

``rlvr resume``, ``rlvr export`` and ``rlvr eval`` refuse a base that differs from the record with one
``ConfigError`` naming the file and what changed; a run recorded before fingerprints existed is not
checked. A hub name is not fingerprinted: its download is addressed by the hub's revision.
Part of the composition root.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rlvr.backends.model.fingerprint import difference_text, differences, fingerprint
from rlvr.backends.model.sources import BaseSource, default_cache_dir, is_gguf, resolve_base
from rlvr.config.run import RunConfig
from rlvr.errors import ConfigError
from rlvr.record.checkpoints import RECORD_DIR
from rlvr.record.run_record import complete_checkpoints
from rlvr.wiring.base import BASE_DIR

RESTORE = "its checkpoints were trained on the old weights: restore them or start a new run"


def base_source(cfg: RunConfig, run_dir: Path, log: Callable[[str], None]) -> BaseSource | None:
    """``model.base`` resolved (a GGUF file converted once, into the cache). A run continued on a GGUF
    file whose content changed since the run began is refused: its checkpoints were trained on the old one."""
    if cfg.model.tiny or cfg.model.base is None:
        return None
    if is_gguf(cfg.model.base):
        log(f"base: {cfg.model.base} (GGUF; converted once into the cache, {default_cache_dir()})")
    source = resolve_base(cfg.model.base)
    _same_gguf(cfg.model.base, _recorded(run_dir), source)
    return source


def base_fingerprint(cfg: RunConfig, run_dir: Path, base: Path,
                     log: Callable[[str], None]) -> dict[str, Any] | None:
    """run.json's ``base_fingerprint`` for ``base``, the folder the run trains over (``None``: a hub
    download or a GGUF conversion). A resumed run whose base folder changed since it began is refused."""
    named = _fingerprinted(cfg, run_dir, base)
    if named is None:
        return None
    now = {"folder": _shown(run_dir, base), **fingerprint(base, say=log)}
    _same_folder(named, _recorded(run_dir), now)
    return now


def run_base(run_dir: Path, cfg: RunConfig, run: dict[str, Any]) -> Path:
    """The base a run's checkpoints apply to (its ``base/``, else ``model.base``), refused where it is
    not the one run.json (``run``) recorded when the run began."""
    if (run_dir / BASE_DIR).exists():
        base = run_dir / BASE_DIR
    else:
        source = resolve_base(str(cfg.loop.base))
        _same_gguf(str(cfg.loop.base), run, source)
        base = Path(source.path)
    named = _fingerprinted(cfg, run_dir, base)
    if named is not None and run.get("base_fingerprint"):
        _same_folder(named, run, fingerprint(base))
    return base


def _fingerprinted(cfg: RunConfig, run_dir: Path, base: Path) -> str | None:
    """How errors name ``base`` when it is a folder a fingerprint covers; ``None`` when it is not one."""
    if base.resolve() == (run_dir / BASE_DIR).resolve():
        return f"{run_dir / BASE_DIR} (the run's own base)"
    spec = cfg.model.base
    if spec is None or is_gguf(spec) or not Path(spec).expanduser().is_dir():
        return None  # a hub download, or a GGUF file's conversion (the file's own hash is recorded)
    return f"model.base={spec!r}"


def _same_gguf(spec: str, run: dict[str, Any], source: BaseSource) -> None:
    recorded = (run.get("base_source") or {}).get("sha256")
    if recorded is not None and recorded != source.sha256:
        raise ConfigError(f"model.base={spec!r}: the file's content changed since this run began "
                          f"(sha256 {recorded[:12]}… then, {str(source.sha256)[:12]}… now); its checkpoints were "
                          "trained on the old file: restore it or start a new run")


def _same_folder(named: str, run: dict[str, Any], now: dict[str, Any]) -> None:
    then = run.get("base_fingerprint")
    if not isinstance(then, dict):
        return  # a run from before fingerprints: nothing to compare with
    changes = differences(then, now)
    if changes:
        raise ConfigError(f"{named}: the folder changed since this run began ({difference_text(changes)}); "
                          f"{RESTORE}")


def _recorded(run_dir: Path) -> dict[str, Any]:
    """run.json as the run began: the run folder's, else (damaged) the newest checkpoint's copy, which
    the loop rebuilds it from; empty for a new run."""
    copies = [c / RECORD_DIR / "run.json" for c in reversed(complete_checkpoints(run_dir))]
    for path in [run_dir / "run.json", *copies]:
        try:
            info = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if isinstance(info, dict):
            return info
    return {}


def _shown(run_dir: Path, base: Path) -> str:
    return BASE_DIR if base.resolve() == (run_dir / BASE_DIR).resolve() else str(base)
