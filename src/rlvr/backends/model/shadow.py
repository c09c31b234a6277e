"""A shadow of a model folder whose ``tokenizer_config.json`` lists ``extra_special_tokens``.

Some exports (a NeMo-merged Hugging Face folder, or any folder transformers 5 saved) write
``extra_special_tokens`` as a list of tokens. transformers 5 reads that list as extra special tokens;
transformers 4 expects a name-to-token mapping there and fails on the list while loading the
tokenizer. A run hands its base to more than one loader (the trainer, ``rlvr serve``, a vLLM in
another Python with its own transformers), so rlvr loads such a folder through a shadow: a folder in
the cache (``models/shadow-NAME-KEY``) holding a symlink to every entry of the original except
``tokenizer_config.json``, which is a copy whose list moved to ``additional_special_tokens`` (what
both versions read as the same special tokens; transformers 5 reports them as its extra special
tokens again). The weights are never copied, and the original folder (which may not be writable) is
never touched.

Invariants: a shadow is built under a temporary name and renamed into place, so a half-built one is
never used; its marker (``rlvr_shadow.json``) records the original folder, its entries and the hash
of the original config, and a shadow whose marker does not match the folder as it is now is rebuilt.
A folder whose ``extra_special_tokens`` is not a list (or that has no tokenizer config) loads as it is.

A backend module: standard library only.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

TOKENIZER_CONFIG = "tokenizer_config.json"
SHADOW_MARKER = "rlvr_shadow.json"


def listed_extra_tokens(folder: Path) -> list[Any] | None:
    """The list form of ``extra_special_tokens`` in ``folder``'s tokenizer config, else ``None``."""
    try:
        config = json.loads((folder / TOKENIZER_CONFIG).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None  # no (readable) tokenizer config: the loader reports what is wrong with it
    found = config.get("extra_special_tokens") if isinstance(config, dict) else None
    return found if isinstance(found, list) else None


def fixed_config(config: dict[str, Any]) -> dict[str, Any]:
    """``config`` with its listed ``extra_special_tokens`` moved to ``additional_special_tokens``."""
    fixed = dict(config)
    listed = fixed.pop("extra_special_tokens")
    before = fixed.get("additional_special_tokens") or []
    fixed["additional_special_tokens"] = [*before, *(t for t in listed if t not in before)]
    return fixed


def shadowed(path: str, cache_dir: Path) -> tuple[str, bool]:
    """``(folder to load, whether it is a shadow)`` for the model folder ``path``."""
    folder = Path(path).expanduser()
    if not folder.is_dir() or listed_extra_tokens(folder) is None:
        return path, False
    original = folder.resolve()
    config_bytes = (original / TOKENIZER_CONFIG).read_bytes()
    want = {"original": str(original), "entries": sorted(p.name for p in original.iterdir()),
            "config_sha256": hashlib.sha256(config_bytes).hexdigest()}
    key = hashlib.sha256(f"{original}\0{want['config_sha256']}".encode()).hexdigest()[:16]
    shadow = cache_dir / "models" / f"shadow-{original.name}-{key}"
    if _marker(shadow) == want:
        return str(shadow), True
    shadow.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=shadow.name + ".", suffix=".tmp", dir=shadow.parent))
    tmp.chmod(0o755)  # a shared cache: readable by whoever runs the server
    try:
        for entry in original.iterdir():
            if entry.name != TOKENIZER_CONFIG:
                (tmp / entry.name).symlink_to(entry)
        config = json.loads(config_bytes.decode("utf-8"))
        (tmp / TOKENIZER_CONFIG).write_text(json.dumps(fixed_config(config), indent=2, ensure_ascii=False) + "\n",
                                            encoding="utf-8")
        (tmp / SHADOW_MARKER).write_text(json.dumps(want, indent=2) + "\n", encoding="utf-8")
        shutil.rmtree(shadow, ignore_errors=True)  # a stale shadow (the folder changed since)
        try:
            tmp.rename(shadow)
        except OSError:  # another process built it first: keep its shadow if it matches
            if _marker(shadow) != want:
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return str(shadow), True


def _marker(shadow: Path) -> Any:
    try:
        return json.loads((shadow / SHADOW_MARKER).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
