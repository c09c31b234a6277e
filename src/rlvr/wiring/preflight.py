"""What a run checks before it writes anything: the model it names, the device and dtype it asks for,
and what the warm start and the reward workers need, each failure in one line naming the key.

Without these a wrong ``model.base`` path, a hub name on a machine without network, or
``model.device = "cuda"`` on a CPU build of torch fail deep inside transformers or torch, with a
long traceback, after the run folder was begun. Here they fail first:

- ``model.base``: a GGUF spec (the file, or the package shipping it, and the ``gguf`` package when it
  is not converted yet); a folder (it exists and holds a ``config.json``); a hub name (in the local
  Hugging Face cache, or else the hub answers for it: a name it does not know, a gated model, and no
  network at all are told apart; transport errors are retried with backoff,
  :mod:`rlvr.backends.model.hub`). ``HF_HUB_OFFLINE`` set means the cache alone.
- ``model.device``: a device torch can parse and this build of torch has (CUDA, MPS), an index it has.
- ``model.dtype`` and ``train.autocast``: bfloat16 where the CUDA device cannot do it.
- ``[sft]``: a warm start imitates each training row's answer, so rows without one are refused.
- ``task.reward_workers`` with a reward of this Python session: worker processes cannot receive it.
Part of the composition root: imports torch and huggingface_hub, lazily.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from rlvr.config.run import RunConfig, TaskSection
from rlvr.errors import ConfigError
from rlvr.session import is_session_spec
from rlvr.types import Split

HUB_NAME = re.compile(r"[A-Za-z0-9][\w.-]*(/[\w.-]+)?")
HUB_TIMEOUT_S = 10.0


def check_start(cfg: RunConfig, split: Split) -> None:
    """Every check of the module doc, in order; the first failure raises a :class:`ConfigError`."""
    if not cfg.model.tiny and cfg.model.base is not None:
        check_base(cfg.model.base)
    check_device(cfg.model.device, cfg.model.dtype, cfg.train.autocast)
    check_warm_start(cfg, split)
    check_reward_workers(cfg)


def check_base(spec: str) -> None:
    """``model.base`` names a model this machine can load now (see the module doc)."""
    from rlvr.backends.model.sources import conversion_ready, gguf_path, is_gguf

    if is_gguf(spec):
        gguf_path(spec)  # the file, or the package shipping it
        if not conversion_ready(spec):
            try:
                import gguf  # noqa: F401  (transformers reads GGUF files through it)
            except ImportError:
                raise ConfigError(f"model.base={spec!r}: a GGUF file is converted once, which needs the gguf "
                                  "package: pip install 'rlvr[smollm2]' (or pip install gguf)") from None
        return
    path = Path(spec).expanduser()
    if path.exists() or _looks_like_a_path(spec):
        _check_folder(spec, path)
        return
    if not HUB_NAME.fullmatch(spec):
        raise ConfigError(f"model.base={spec!r}: no such folder, and not a hub name (org/name)")
    _check_hub(spec)


def _looks_like_a_path(spec: str) -> bool:
    return spec.startswith(("/", "./", "../", "~")) or spec.count("/") > 1 or os.sep != "/" and os.sep in spec


def _check_folder(spec: str, path: Path) -> None:
    from rlvr.backends.model.sources import resolve_base

    if not path.exists():
        raise ConfigError(f"model.base={spec!r}: no such folder ({path.resolve()})")
    if not path.is_dir():
        raise ConfigError(f"model.base={spec!r} is a file; give the model folder (or a .gguf file)")
    resolve_base(spec)  # a folder of GGUF files is named as such
    if not (path / "config.json").exists():
        raise ConfigError(f"model.base={spec!r}: this folder has no config.json, so it is not a Hugging Face "
                          "model folder (save one with model.save_pretrained(folder))")


def _check_hub(name: str) -> None:
    """In the local cache, or the hub answers for it; else one line naming why not."""
    try:
        import huggingface_hub as hub
        from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError
    except ImportError:  # transformers depends on it: only a broken install lands here
        return
    if isinstance(hub.try_to_load_from_cache(name, "config.json"), str):
        return
    if os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on"):
        raise ConfigError(f"model.base={name!r} is not in the local Hugging Face cache and HF_HUB_OFFLINE is set; "
                          "download it where there is network (huggingface-cli download NAME) or give a folder")
    from rlvr.backends.model.hub import with_retries
    from rlvr.errors import HubUnreachableError

    try:
        with_retries(lambda: hub.HfApi().model_info(name, timeout=HUB_TIMEOUT_S), f"looking up {name}")
    except GatedRepoError:
        raise ConfigError(f"model.base={name!r} is gated on the hub: accept its terms on the model page and log "
                          "in (huggingface-cli login)") from None
    except RepositoryNotFoundError:
        raise ConfigError(f"model.base={name!r}: the hub has no such model (or it is private: huggingface-cli "
                          "login); a local folder must exist") from None
    except Exception as exc:  # noqa: BLE001 - every other failure means the same thing here
        endpoint = os.environ.get("HF_ENDPOINT", "https://huggingface.co")
        cause = exc.__cause__ if isinstance(exc, HubUnreachableError) and exc.__cause__ is not None else exc
        tries = f", {exc.attempts} attempts" if isinstance(exc, HubUnreachableError) else ""
        raise ConfigError(f"model.base={name!r}: no local folder of that name, not in the local Hugging Face cache, "
                          f"and {endpoint} cannot be reached to download it ({type(cause).__name__}{tries}); download "
                          "it where there is network, or give a local folder") from None


def check_device(device: str, dtype: str, autocast: str) -> None:
    """``model.device`` exists in this torch; bfloat16 where the device cannot do it is refused."""
    import torch

    try:
        where = torch.device(device)
    except (RuntimeError, ValueError):
        raise ConfigError(f"model.device={device!r} is not a device torch knows (cpu, cuda, cuda:N, mps)") from None
    build = f"this torch ({torch.__version__})"
    if where.type == "cuda":
        if not torch.cuda.is_available():
            reason = "is built without CUDA" if torch.version.cuda is None else "sees no CUDA device"
            raise ConfigError(f"model.device={device!r}, but {build} {reason}; use model.device = 'cpu' or "
                              "install a CUDA build of torch")
        count = torch.cuda.device_count()
        if where.index is not None and where.index >= count:
            raise ConfigError(f"model.device={device!r}, but {build} sees {count} CUDA device(s): cuda:0"
                              + (f" to cuda:{count - 1}" if count > 1 else ""))
        if "bfloat16" in (dtype, autocast) and not torch.cuda.is_bf16_supported():
            key = "model.dtype" if dtype == "bfloat16" else "train.autocast"
            raise ConfigError(f"{key} = 'bfloat16', but {device} cannot compute in bfloat16; use float16 or float32")
    elif where.type == "mps" and not torch.backends.mps.is_available():
        raise ConfigError(f"model.device={device!r}, but {build} has no MPS device; use model.device = 'cpu'")
    elif where.type not in ("cpu", "cuda", "mps"):
        raise ConfigError(f"model.device={device!r}: rlvr runs on cpu, cuda or mps")


def check_warm_start(cfg: RunConfig, split: Split) -> None:
    """A warm start teaches each training row's answer (or its ``info[sft.target]``): rows without one
    leave nothing to imitate."""
    if cfg.sft.steps == 0:
        return
    target = cfg.sft.target
    if target is not None:
        lacking = [t for t in split.train if not isinstance(t.info.get(target), str) or not t.info[target].strip()]
        if lacking:
            raise ConfigError(f"sft.target = {target!r}: the warm start teaches each training row's info[{target!r}], "
                              f"and {len(lacking)} of {len(split.train)} have no text there (row {lacking[0].id!r}, "
                              f"whose info has {sorted(lacking[0].info) or 'no fields'}): name a field every row has, "
                              "or leave sft.target unset to teach the answer")
        return
    missing = [t for t in split.train if t.answer is None]
    if missing:
        raise ConfigError(f"sft.steps = {cfg.sft.steps}: the warm start imitates each training row's answer, and "
                          f"{len(missing)} of {len(split.train)} have none (row {missing[0].id!r}; prompt-only data): "
                          "set sft.steps = 0, or give the rows an answer column (task.fields)")


def _sections(cfg: RunConfig) -> Iterable[tuple[str, TaskSection]]:
    return [("task", cfg.task)] if not cfg.envs else [(f"envs.{n}", s) for n, s in cfg.envs.items()]


def check_reward_workers(cfg: RunConfig) -> None:
    """Reward worker processes load their reward from its spec: one held by this Python session cannot go."""
    for where, section in _sections(cfg):
        specs: list[Any] = [*section.rewards, section.env]
        held = [s for s in specs if isinstance(s, str) and is_session_spec(s.removeprefix("trl:"))]
        if section.reward_workers and held:
            raise ConfigError(f"{where}.reward_workers = {section.reward_workers}: the reward {held[0]!r} is a "
                              "function of this Python session, which worker processes cannot load; put it in a "
                              ".py file and name it ('file.py:fn'), or set reward_workers = 0")
