"""``rlvr export``: a run's selected (or any) checkpoint as a PEFT adapter and a merged model.

The adapter's ``adapter_config.json`` names the base as the run named it (a hub name, a folder, a GGUF
spec; the run's own ``base/`` when it built or warm-started one), never a cache folder of the machine
that trained it; ``README.md`` (in the export and in ``adapter/`` and ``merged/``) is the model card
of :mod:`rlvr.cli.model_card`; ``rlvr_lineage.json`` (there too) carries on what the weights were
trained on (:mod:`rlvr.record.lineage`). A damaged checkpoint, and a base that is not the one the run
recorded (:mod:`rlvr.wiring.base_trust`), are refused before anything is loaded; a write the disk refuses
is one ``RecordError``. Part of the composition root: imports backends.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import peft

from rlvr.backends.model.io import load_model, load_tokenizer
from rlvr.backends.train.trainer import write_failures
from rlvr.cli.model_card import base_name, model_card
from rlvr.errors import RecordError
from rlvr.record.checkpoints import require_sound
from rlvr.record.lineage import copy_lineage
from rlvr.record.run_record import TRAINER_DIR, checkpoint_name, disk_errors, read_record
from rlvr.wiring.base_trust import run_base
from rlvr.wiring.seams import saved_config


def export(run_dir: Path, out: Path, step: int | None = None) -> dict[str, str]:
    """Write checkpoint ``step`` (default: the selected one) as ``adapter/`` and ``merged/``."""
    cfg = saved_config(run_dir)
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
    named = base_name(run_dir, cfg)
    adapter = ckpt / "adapter"
    if adapter.exists():
        model = peft.PeftModel.from_pretrained(load_model(str(base), dtype=cfg.model.dtype), str(adapter))
        model = model.merge_and_unload()
    else:
        from safetensors.torch import load_model as load_weights

        model = load_model(str(base), dtype=cfg.model.dtype)
        load_weights(model, str(ckpt / "weights.safetensors"))
    written = {"adapter": str(out / "adapter")} if adapter.exists() else {}
    written["merged"] = str(out / "merged")
    card = model_card(record, cfg, step, named)
    with disk_errors(f"the export {out}", "free space and export again"), write_failures(out):
        out.mkdir(parents=True, exist_ok=True)
        if adapter.exists():
            shutil.copytree(adapter, out / "adapter", dirs_exist_ok=True)
            _name_base(out / "adapter" / "adapter_config.json", named)
        model.save_pretrained(out / "merged")
        tokenizer.save_pretrained(out / "merged")
        for folder in (out, *(Path(p) for p in written.values())):
            (folder / "README.md").write_text(card, encoding="utf-8")  # PEFT's blank template, replaced
        written["card"] = str(out / "README.md")
        (out / "export.json").write_text(json.dumps({"step": step, "run": str(run_dir), "base": named, **written},
                                                    indent=2))
        copy_lineage(run_dir, out, *(Path(written[k]) for k in ("adapter", "merged") if k in written))
    return written


def _name_base(config_file: Path, base: str) -> None:
    config = json.loads(config_file.read_text())
    config["base_model_name_or_path"] = base
    config_file.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
