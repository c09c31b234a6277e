"""The hub model a local base came from, so an exported adapter names it as anyone can load it.

A run may load its base from a GGUF file (shipped inside a package, or a path) or a folder (often a
snapshot in the Hugging Face cache). An adapter that names such a base by its path loads on one
machine only, and ``gguf:...`` loads nowhere (``from_pretrained`` takes no GGUF spec). The hub name,
read from what the base says about itself, loads wherever that model is in the local cache (or can
be downloaded):

- a GGUF file: ``general.source.huggingface.repository``, else a Hugging Face URL in
  ``general.source.url`` or ``general.base_model.0.repo_url``, else ``general.organization`` with
  the file's own name less its quantisation suffix (``SmolLM2-135M-Instruct.Q4_1.gguf`` of
  ``HuggingFaceTB`` is ``HuggingFaceTB/SmolLM2-135M-Instruct``), read with the ``gguf`` package;
- a folder: the cache layout around it (``hub/models--ORG--NAME/snapshots/REV``), else its
  ``config.json``'s ``_name_or_path`` when that is a hub name.

``None`` when nothing says: the caller names the base otherwise. Nothing here touches the network.
A backend module (reads GGUF metadata through the optional ``gguf`` package).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from rlvr.backends.model.sources import is_hub_name

CACHE_FOLDER = re.compile(r"models--(?P<org>.+?)--(?P<name>.+)")
HF_URL = re.compile(r"https?://(?:www\.)?huggingface\.co/(?P<repo>[\w.-]+/[\w.-]+?)(?:\.git)?/?$")
# A quantisation or precision suffix of a GGUF file's name: .Q4_1, -Q4_K_M, .IQ3_XS, .f16, -BF16...
QUANT_SUFFIX = re.compile(r"[.-](?:I?Q\d[\w]*|[Ff](?:16|32)|[Bb][Ff]16)$")


def hub_name_of_folder(folder: str | Path) -> str | None:
    """The hub name of a model folder (see the module doc), or ``None``."""
    path = Path(folder).expanduser().resolve()
    for part in reversed(path.parts):
        found = CACHE_FOLDER.fullmatch(part)
        if found:
            return f"{found['org']}/{found['name']}"
    try:
        named = json.loads((path / "config.json").read_text(encoding="utf-8")).get("_name_or_path")
    except (OSError, ValueError, AttributeError):
        return None
    if isinstance(named, str) and "/" in named and is_hub_name(named) and not Path(named).exists():
        return named
    return None


def hub_name_of_gguf(gguf: str | Path) -> str | None:
    """The hub name a GGUF file's metadata gives (see the module doc), or ``None`` (no ``gguf`` package,
    an unreadable file, or nothing said)."""
    meta = gguf_metadata(gguf)
    repository = meta.get("general.source.huggingface.repository")
    if isinstance(repository, str) and is_hub_name(repository) and "/" in repository:
        return repository
    for key in ("general.source.url", "general.base_model.0.repo_url"):
        found = HF_URL.match(str(meta.get(key, "")))
        if found:
            return found["repo"]
    organization = meta.get("general.organization")
    if isinstance(organization, str) and organization.strip():
        name = f"{organization.strip()}/{QUANT_SUFFIX.sub('', Path(gguf).stem)}"
        return name if is_hub_name(name) else None
    return None


def gguf_metadata(gguf: str | Path) -> dict[str, Any]:
    """A GGUF file's ``general.*`` metadata as plain values (``{}`` without the ``gguf`` package)."""
    try:
        from gguf import GGUFReader
    except ImportError:
        return {}
    try:
        reader = GGUFReader(str(gguf))
    except (OSError, ValueError):
        return {}
    return {name: _value(field) for name, field in reader.fields.items() if name.startswith("general.")}


def _value(field: Any) -> Any:
    contents = getattr(field, "contents", None)
    if callable(contents):
        return contents()
    part = field.parts[field.data[0]] if field.data else None  # older gguf: raw parts
    if part is None:
        return None
    try:
        return bytes(part).decode("utf-8")
    except (TypeError, UnicodeDecodeError):
        return part.tolist()[0] if len(part) == 1 else None
