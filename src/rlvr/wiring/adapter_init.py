"""``[model] adapter_init``: start a LoRA run from an existing PEFT adapter.

The folder may be the adapter itself (``adapter_config.json`` + ``adapter_model.safetensors``) or a
folder holding one as ``adapter/`` (an ``rlvr export`` output, a checkpoint's ``trainer/``). The
run's LoRA shape stays the config's: an adapter whose rank, alpha or target modules differ from
``loop.lora_rank`` / ``train.lora_alpha`` / ``train.lora_targets`` is refused with the adapter's
values, so the config a run records is the shape it trained. Refusals come from
:func:`inspect_adapter`, before anything is written to the run folder; :func:`load_adapter` puts the
weights into the policy before the trainer, the sampler replica or a sampler server's first publish
see it, so step 0 (held-out included) is that adapter. The lineage (``run.json``
``adapter_init``) names the folder and a sha256 over its files.
Part of the composition root: imports backends (peft, safetensors) lazily.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from rlvr.config.run import RunConfig
from rlvr.errors import ConfigError

ADAPTER_CONFIG, ADAPTER_WEIGHTS = "adapter_config.json", "adapter_model.safetensors"


def adapter_folder(spec: str) -> Path:
    """The adapter folder ``spec`` names (itself, or its ``adapter/``); refused when there is none."""
    root = Path(spec).expanduser()
    for folder in (root, root / "adapter"):
        if (folder / ADAPTER_CONFIG).is_file() and (folder / ADAPTER_WEIGHTS).is_file():
            return folder
    if not root.is_dir():
        raise ConfigError(f"model.adapter_init={spec!r} is not a folder; give a PEFT adapter folder (an "
                          "`rlvr export` output or its adapter/, or a checkpoint's trainer/)")
    if (root / "sharded" / ".metadata").is_file():  # train.checkpoint_layout = "sharded" (checkpoint_io.py)
        raise ConfigError(f"model.adapter_init={spec!r} is a sharded checkpoint (torch.distributed.checkpoint "
                          "shards, no PEFT folder): `rlvr export` the run's step and give the export's adapter/")
    raise ConfigError(f"model.adapter_init={spec!r} is not a PEFT adapter: neither it nor its adapter/ holds "
                      f"{ADAPTER_CONFIG} and {ADAPTER_WEIGHTS} (a full fine-tune's checkpoint has no adapter)")


def content_sha256(folder: Path) -> str:
    """sha256 over the folder's files (names and bytes, sorted by name): the adapter's identity."""
    digest = hashlib.sha256()
    for path in sorted(p for p in folder.iterdir() if p.is_file()):
        digest.update(path.name.encode() + b"\0")
        with path.open("rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                digest.update(chunk)
        digest.update(b"\0")
    return digest.hexdigest()


def inspect_adapter(cfg: RunConfig) -> dict[str, Any] | None:
    """The lineage entry of ``model.adapter_init`` (None when unset), after checking it fits the run."""
    spec = cfg.model.adapter_init
    if spec is None:
        return None
    folder = adapter_folder(spec)
    try:
        meta = json.loads((folder / ADAPTER_CONFIG).read_text())
    except (OSError, ValueError) as exc:
        raise ConfigError(f"model.adapter_init: {folder / ADAPTER_CONFIG} cannot be read as JSON ({exc})") from None
    if str(meta.get("peft_type", "")).upper() != "LORA":
        raise ConfigError(f"model.adapter_init: {folder} is a {meta.get('peft_type')!r} adapter; rlvr trains LoRA")
    found = {"loop.lora_rank": meta.get("r"), "train.lora_alpha": meta.get("lora_alpha"),
             "train.lora_targets": _targets(meta.get("target_modules"))}
    wanted = {"loop.lora_rank": cfg.loop.lora_rank, "train.lora_alpha": cfg.train.lora_alpha,
              "train.lora_targets": sorted(cfg.train.lora_targets)}
    differ = [f"{k} = {wanted[k]!r} but the adapter has {found[k]!r}" for k in wanted if found[k] != wanted[k]]
    for flag in ("use_dora", "use_rslora"):
        if meta.get(flag):
            differ.append(f"the adapter sets {flag} = true, which rlvr's LoRA does not")
    if differ:
        raise ConfigError(f"model.adapter_init={spec!r} does not fit this run: {'; '.join(differ)}. Set the run's "
                          "keys to the adapter's values (the run keeps the shape its config names)")
    return {"path": str(folder.resolve()), "sha256": content_sha256(folder), "rank": meta.get("r"),
            "alpha": meta.get("lora_alpha"), "targets": found["train.lora_targets"],
            "base_model_name_or_path": meta.get("base_model_name_or_path")}


def _targets(value: Any) -> Any:
    return sorted(value) if isinstance(value, (list, tuple)) else value  # a regex string stays as it is


def load_adapter(policy: Any, lineage: dict[str, Any]) -> None:
    """Copy the adapter's weights into ``policy``'s LoRA modules; every one of them must be filled."""
    from peft import set_peft_model_state_dict
    from safetensors.torch import load_file

    if not policy.is_lora:
        raise ConfigError("model.adapter_init needs a LoRA policy (loop.lora_rank > 0)")
    folder = Path(lineage["path"])
    weights = load_file(folder / ADAPTER_WEIGHTS)
    try:
        result = set_peft_model_state_dict(policy.model, weights)
    except RuntimeError as exc:  # a shape mismatch: the adapter was trained on another architecture
        raise ConfigError(f"model.adapter_init: the weights in {folder} do not fit this base model "
                          f"({str(exc).splitlines()[0][:300]}); use the base the adapter was trained on") from None
    unexpected = list(getattr(result, "unexpected_keys", []) or [])
    missing = [k for k in getattr(result, "missing_keys", []) or [] if "lora_" in k]
    if unexpected or missing:
        raise ConfigError(f"model.adapter_init: {folder} does not match this base's LoRA modules (adapter keys "
                          f"the model lacks: {unexpected[:3]}; model LoRA keys the adapter lacks: {missing[:3]}); "
                          "use the base the adapter was trained on")
