"""What an export says about itself: the base its adapter applies to, and a model card.

A PEFT adapter names its base in ``adapter_config.json`` (``base_model_name_or_path``); as saved by the
trainer that is the folder the policy was loaded from, a cache folder of the machine that trained it.
:class:`ExportBase` is the base as anyone can load it: the hub model (as the run named it, or as the
GGUF file or the folder says it came from: :mod:`rlvr.backends.model.hub_names`), or, where the run
built or warm-started its base (the adapter applies to those weights, not to the model they came
from), that base carried in the export beside the adapter as ``base/``. No exported file holds a path
of the machine that made it.

:func:`model_card` is the export's README.md, made from the run record alone: the base, the selected
step and why (held-out only), every evaluation's held-out score beside the training rows scored the
same way and the pool score, the gain (in points only for rewards in [0, 1]), the data as it came (a
file by its name, rows held in memory as such, an environment's own rows), the split's hashes, the
reward and the config hash. Part of the composition root; standard library only.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlvr.config.run import RunConfig
from rlvr.data.readers import spec_label
from rlvr.record.gain import change_text, observed_in_unit_interval
from rlvr.record.run_record import EventKind, RunRecord

CARRIED = "base"  # the export's own copy of a base the run built or warm-started


@dataclass(frozen=True)
class ExportBase:
    """What an export's adapter applies to: ``name`` (its ``base_model_name_or_path``), the ``hub``
    model when known, whether the export ``carried`` the run's own base, and the GGUF file's name when
    the run dequantised one."""

    name: str
    hub: str | None = None
    carried: bool = False
    gguf: str | None = None


def _score(value: Any) -> str:
    return "-" if not isinstance(value, (int, float)) else f"{value:.3f}"


def _evaluations(record: RunRecord) -> list[str]:
    pool = record.pool_scores
    rows = ["| step | held-out | training rows, scored like held-out | pool (mean reward of training samples) |",
            "|---:|---:|---:|---:|"]
    for event in record.of_kind(EventKind.HELDOUT):
        rows.append(f"| {event.step} | {_score(event.data.get('score'))} | {_score(event.data.get('train_score'))} "
                    f"| {_score(pool.get(event.step))} |")
    return rows


def _data(cfg: RunConfig, run: dict[str, Any]) -> list[str]:
    task, split = cfg.task, run.get("split") or {}
    source = run.get("data_source")
    if isinstance(source, dict):
        source = "; ".join(f"{name}: {text}" for name, text in source.items())
    elif source is None:  # a run recorded before the source was: read from its config
        source = spec_label(task.data) if task.data else (
            f"procedural task {task.name!r} (n = {task.n}, seed = {task.seed})" if task.name else "-")
    weights = task.reward_weights or [1.0] * len(task.rewards)
    reward = ", ".join(f"{_spec(r)} (weight {w})" for r, w in zip(task.rewards, weights, strict=True)) or _spec(
        task.env or task.name or "-")
    evaluated = split.get("n_heldout_evaluated")
    return [f"- data: {source}",
            f"- split: {split.get('n_train', '?')} training rows, {split.get('n_heldout', '?')} held out "
            f"(held-out fraction {cfg.loop.heldout_frac}, salt {cfg.loop.split_salt!r}, by content hash)"
            + (f"; {evaluated} held-out rows scored at each evaluation" if evaluated else ""),
            f"- training split sha256: `{split.get('train_hash', '?')}`",
            f"- held-out split sha256: `{split.get('heldout_hash', '?')}`",
            f"- reward: {reward}"]


def _spec(spec: str) -> str:
    if "session:" in spec:  # a function rlvr.train was given
        return f"{spec.rsplit(':', 1)[-1]} (a function of the Python session that ran it)"
    prefix = next((p for p in ("trl:", "rm:") if spec.startswith(p)), "")
    rest = spec[len(prefix):]
    location, sep, attr = rest.rpartition(":")
    if not sep or not attr.isidentifier():
        location, attr = rest, ""
    if location.endswith(".py") or Path(location).is_absolute():  # a file of this machine: its name only
        return prefix + Path(location).name + (f":{attr}" if attr else "")
    return spec


def model_card(record: RunRecord, cfg: RunConfig, step: int, base: ExportBase) -> str:
    """The export's README.md (see the module doc)."""
    held, run = record.heldout_scores, record.run
    unit = observed_in_unit_interval(record.metrics, held, record.pool_scores)
    selected = record.selected_step
    why = ("the best held-out score (ties: the earliest step); training rows and pool scores are never used"
           if step == selected else f"asked for (rlvr export --step {step}); held-out selected step {selected}")
    gain = (f"{change_text(held[0], held[step], unit)} over step 0 ({held[0]:.3f} → {held[step]:.3f})"
            if 0 in held and step in held else "-")
    lines = ["---", "library_name: peft", "tags: [rlvr, reinforcement-learning, lora]",
             *([f"base_model: {base.hub}"] if base.hub else []),
             "---", "", f"# {record.path.name if record.path else 'rlvr run'}: fine-tuned with rlvr", "",
             f"- base: `{base.name}`" + _base_note(cfg, base),
             *([f"- GGUF file: `{base.gguf}` (sha256 `{(run.get('base_source') or {}).get('sha256')}`), dequantised "
                "to float32 before training: the adapter was trained on those weights"] if base.gguf else []),
             f"- checkpoint: step {step} (the run trained {max(record.pool_scores, default=0)} steps); chosen as {why}",
             f"- held-out gain: {gain}", "", "## Evaluations", "", *_evaluations(record), "",
             "## Data", "", *_data(cfg, run), "",
             "## Run", "",
             f"- config sha256: `{run.get('config_sha256', '?')}` (the full config is config.json in the run folder)",
             f"- rlvr {run.get('rlvr_version', '?')}; "
             + ", ".join(f"{k} {v}" for k, v in sorted((run.get("versions") or {}).items())), "",
             "## Use", "", "```python", *_use(base), "```", "",
             "`merged/` holds the same weights with the adapter merged in; `rlvr serve merged` serves it.", ""]
    return "\n".join(lines)


def _base_note(cfg: RunConfig, base: ExportBase) -> str:
    if base.carried:
        made = f"the model `{spec_label(cfg.model.base)}` warm-started" if cfg.model.base else "built"
        return f" ({made} by the run; carried in the export as `{CARRIED}/`, beside `adapter/`)"
    if base.gguf and base.hub:
        return f" (the hub model the GGUF file `{base.gguf}` was made from, as its metadata says)"
    if base.gguf:
        return " (the GGUF file's metadata names no hub model: load `merged/`)"
    return ""


def _use(base: ExportBase) -> list[str]:
    if base.gguf and not base.hub:  # transformers loads a GGUF base only through its file argument
        return ["from transformers import AutoModelForCausalLM", "",
                "model = AutoModelForCausalLM.from_pretrained(\"merged\")  # the base is a GGUF file"]
    if base.carried:
        return ["from peft import PeftModel", "from transformers import AutoModelForCausalLM", "",
                "# in the export folder: the base the run trained the adapter on is base/",
                f"base = AutoModelForCausalLM.from_pretrained({CARRIED!r})",
                "model = PeftModel.from_pretrained(base, \"adapter\")"]
    return ["from peft import AutoPeftModelForCausalLM", "",
            f"model = AutoPeftModelForCausalLM.from_pretrained(\"adapter\")  # over {base.name!r}"]
