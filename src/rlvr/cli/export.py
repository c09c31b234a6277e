"""``rlvr export``: a run's selected (or any) checkpoint as a PEFT adapter and a merged model.

The adapter's ``adapter_config.json`` names its base as anyone can load it (:func:`export_base`): a hub name
as the run named it, or as a GGUF file's metadata or a folder's cache layout or ``config.json`` says it came
from (``AutoPeftModelForCausalLM.from_pretrained("adapter")`` then works wherever that model is in the local
cache); where the run built or warm-started its own base, that base is carried in the export as ``base/``.
``README.md`` (in the export and in ``adapter/`` and ``merged/``) is the model card of
:mod:`rlvr.cli.model_card`; ``rlvr_lineage.json`` (there too) carries on what the weights were trained on
(:mod:`rlvr.record.lineage`); ``export.json`` names the folders relative to the export. With ``--gguf`` (a
run over a GGUF base) the merged model is also written back as a GGUF file shaped and quantised as the
base's own (:mod:`rlvr.backends.model.gguf_export`), under ``gguf/`` with the base file's name, so it loads
where the base's file did. A sharded checkpoint (``train.checkpoint_layout = "sharded"``:
torch.distributed.checkpoint shards of any number of ranks) is read whole into the run's policy in this
process and written out in the same plain layout. No exported file holds a path of this machine. A damaged
checkpoint, and a base that is not the one the run recorded (:mod:`rlvr.wiring.base_trust`), are refused
before anything is loaded; a write the disk refuses is one ``RecordError``. Part of the composition root:
imports backends.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import peft

from rlvr.backends.model.gguf_export import write_gguf
from rlvr.backends.model.hub_names import hub_name_of_folder, hub_name_of_gguf
from rlvr.backends.model.io import load_model, load_tokenizer
from rlvr.backends.model.sources import gguf_path, is_gguf
from rlvr.backends.train.checkpoint_io import is_sharded_checkpoint, read_weights, write_failures
from rlvr.cli.model_card import CARRIED, ExportBase, model_card
from rlvr.config.run import RunConfig
from rlvr.errors import ConfigError, RecordError
from rlvr.record.checkpoints import require_sound
from rlvr.record.lineage import copy_lineage
from rlvr.record.run_record import TRAINER_DIR, checkpoint_name, disk_errors, read_record
from rlvr.wiring.base import BASE_DIR, BASE_MARKER
from rlvr.wiring.base_trust import run_base
from rlvr.wiring.seams import saved_config
from rlvr.wiring.trainer import make_policy


def export(run_dir: Path, out: Path, step: int | None = None, gguf: bool = False) -> dict[str, str]:
    """Write checkpoint ``step`` (default: the selected one) as ``adapter/`` and ``merged/`` (and, with
    ``gguf``, ``gguf/NAME.gguf``: the merged model re-quantised as the base's GGUF file)."""
    cfg = saved_config(run_dir)
    source = gguf_source(run_dir, cfg) if gguf else None
    record = read_record(run_dir)
    step = record.selected_step if step is None else step
    if step is None:
        raise RecordError(f"{run_dir}: no checkpoint was selected yet (no held-out evaluation recorded)")
    ckpt = run_dir / checkpoint_name(step) / TRAINER_DIR
    if not ckpt.exists():
        raise RecordError(f"{run_dir}: checkpoint of step {step} is not on disk (pruned or never written)")
    require_sound(ckpt.parent)
    base = run_base(run_dir, cfg, record.run)  # the base the run recorded, or a refusal naming what changed
    tokenizer = load_tokenizer(str(base))
    named = export_base(run_dir, cfg, record.run)
    adapter = ckpt / "adapter"
    if is_sharded_checkpoint(ckpt):  # the shards of any number of ranks, read whole into the run's policy
        model = make_policy(cfg, base, need_reference=False).model
        read_weights(ckpt, model)
    elif adapter.exists():
        model = peft.PeftModel.from_pretrained(load_model(str(base), dtype=cfg.model.dtype), str(adapter))
    else:
        model = load_model(str(base), dtype=cfg.model.dtype)
        read_weights(ckpt, model)
    lora = isinstance(model, peft.PeftModel)
    written = {"adapter": str(out / "adapter")} if lora else {}
    written["merged"] = str(out / "merged")
    card = model_card(record, cfg, step, named)
    with disk_errors(f"the export {out}", "free space and export again"), write_failures(out):
        out.mkdir(parents=True, exist_ok=True)
        if lora:
            if adapter.exists():
                shutil.copytree(adapter, out / "adapter", dirs_exist_ok=True)
            else:  # a sharded checkpoint's adapter, in PEFT's own layout
                model.save_pretrained(out / "adapter")
            _name_base(out / "adapter" / "adapter_config.json", named.name)
            if named.carried:  # the weights the adapter applies to exist nowhere else
                shutil.copytree(run_dir / BASE_DIR, out / CARRIED, dirs_exist_ok=True,
                                ignore=shutil.ignore_patterns(BASE_MARKER))
                written["base"] = str(out / CARRIED)
        merged = model.merge_and_unload() if lora else model  # what merged/ and the GGUF file both hold
        merged.save_pretrained(out / "merged")
        tokenizer.save_pretrained(out / "merged")
        if source is not None:
            (out / "gguf").mkdir(exist_ok=True)
            report = write_gguf(merged, source, out / "gguf" / source.name)
            written["gguf"] = report["file"]
            if report["fell_back_to_q8_0"]:
                written["gguf_note"] = (f"{len(report['fell_back_to_q8_0'])} tensor(s) written as Q8_0: the gguf "
                                        f"package cannot quantise into their type ({source.name})")
        for folder in (out, *(Path(written[k]) for k in ("adapter", "merged") if k in written)):
            (folder / "README.md").write_text(card, encoding="utf-8")  # PEFT's blank template, replaced
        written["card"] = str(out / "README.md")
        (out / "export.json").write_text(json.dumps(
            {"step": step, "run": run_dir.resolve().name, "base": named.name, "hub_model": named.hub,
             **{k: str(Path(v).relative_to(out)) if k != "gguf_note" else v for k, v in written.items()}},
            indent=2))
        copy_lineage(run_dir, out, *(Path(written[k]) for k in ("adapter", "merged") if k in written))
    return written


def gguf_source(run_dir: Path, cfg: RunConfig) -> Path:
    """The GGUF file the run's base came from, which ``--gguf`` re-quantises into; refused for any other base."""
    spec = cfg.model.base
    if (run_dir / BASE_DIR).exists() or spec is None or not is_gguf(spec):
        shown = "the run's own base/" if (run_dir / BASE_DIR).exists() or spec is None else f"model.base={spec!r}"
        raise ConfigError(f"rlvr export --gguf: {run_dir}: {shown} is not a GGUF file; --gguf writes the model back "
                          "into the GGUF file the base came as (export merged/ and convert it with llama.cpp's "
                          "convert_hf_to_gguf.py instead)")
    return gguf_path(spec)


def export_base(run_dir: Path, cfg: RunConfig, run: dict[str, Any]) -> ExportBase:
    """What the export's adapter applies to, named as anyone can load it (see the module doc)."""
    gguf = (run.get("base_source") or {}).get("gguf_file")
    gguf_name = Path(gguf).name if gguf else None
    spec = cfg.model.base
    if (run_dir / BASE_DIR).exists() or spec is None:
        return ExportBase(CARRIED, carried=True, gguf=gguf_name)
    if gguf or is_gguf(spec):
        try:
            file = gguf_path(spec) if is_gguf(spec) else Path(str(gguf))
        except ConfigError:
            file = Path(gguf or spec)
        hub = hub_name_of_gguf(file)
        return ExportBase(hub or spec, hub, gguf=gguf_name or file.name)
    folder = Path(spec).expanduser()
    if folder.is_dir():
        hub = hub_name_of_folder(folder)
        return ExportBase(hub or (folder.name if folder.is_absolute() else spec), hub)
    return ExportBase(spec, spec)


def _name_base(config_file: Path, base: str) -> None:
    config = json.loads(config_file.read_text())
    config["base_model_name_or_path"] = base
    config_file.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
