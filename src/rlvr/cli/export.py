"""``rlvr export``: a run's selected (or any) checkpoint as a PEFT adapter and a merged model.

Part of the composition root: imports backends.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import peft

from rlvr.backends.model.io import load_model, load_tokenizer
from rlvr.backends.model.sources import resolve_base
from rlvr.backends.train.trainer import write_failures
from rlvr.cli.lineage import copy_lineage
from rlvr.cli.settings import RunConfig
from rlvr.cli.warm_start import BASE_DIR
from rlvr.cli.wiring import saved_config
from rlvr.errors import RecordError
from rlvr.run.checkpoints import require_sound
from rlvr.run.record import TRAINER_DIR, checkpoint_name, disk_errors, read_record


def run_base(run_dir: Path, cfg: RunConfig) -> Path:
    """The base a run's checkpoints apply to: its warm-started ``base/``, else ``model.base``."""
    return run_dir / BASE_DIR if (run_dir / BASE_DIR).exists() else Path(resolve_base(str(cfg.loop.base)).path)


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
    base = run_base(run_dir, cfg)
    tokenizer = load_tokenizer(str(base))
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
    with disk_errors(f"the export {out}", "free space and export again"), write_failures(out):
        out.mkdir(parents=True, exist_ok=True)
        if adapter.exists():
            shutil.copytree(adapter, out / "adapter", dirs_exist_ok=True)
        model.save_pretrained(out / "merged")
        tokenizer.save_pretrained(out / "merged")
        (out / "export.json").write_text(json.dumps({"step": step, "run": str(run_dir), **written}, indent=2))
        copy_lineage(run_dir, out, *(Path(p) for p in written.values()))  # a run started from it is checked against it
    return written
