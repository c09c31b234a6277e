"""What an export says about itself: the base its adapter applies to, and a model card.

A PEFT adapter names its base in ``adapter_config.json`` (``base_model_name_or_path``); as saved by the
trainer that is the folder the policy was loaded from, which for a hub model or a GGUF file is a cache
folder of the machine that trained it. :func:`base_name` is the base as the run named it: the hub name,
the model folder (absolute), or the GGUF spec; or the run's own ``base/`` folder when the run built or
warm-started its base there (the adapter applies to those weights, not to the model they came from).

:func:`model_card` is the export's README.md, made from the run record alone: the base, the selected
step and why (held-out only), every evaluation's held-out score beside the training rows scored the
same way and the pool score, the gain (in points only for rewards in [0, 1]), the data and the split's
hashes, the reward and the config hash. Part of the composition root; standard library only.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rlvr.config.run import RunConfig
from rlvr.record.gain import change_text, observed_in_unit_interval
from rlvr.record.run_record import EventKind, RunRecord
from rlvr.wiring.base import BASE_DIR


def base_name(run_dir: Path, cfg: RunConfig) -> str:
    """The base the run's adapter applies to, as a person (or ``from_pretrained``) names it."""
    if (run_dir / BASE_DIR).exists() or cfg.model.base is None:
        return str((run_dir / BASE_DIR).resolve())
    spec = cfg.model.base
    folder = Path(spec).expanduser()
    return str(folder.resolve()) if folder.is_dir() else spec


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


def _data(cfg: RunConfig, split: dict[str, Any]) -> list[str]:
    task = cfg.task
    source = task.data or (f"procedural task {task.name!r} (n = {task.n}, seed = {task.seed})" if task.name else "-")
    if source.startswith("session:"):
        source = "rows held in memory by the Python session that ran it (rlvr.train(data=...))"
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
    return spec


def model_card(record: RunRecord, cfg: RunConfig, step: int, base: str) -> str:
    """The export's README.md (see the module doc)."""
    held, run = record.heldout_scores, record.run
    unit = observed_in_unit_interval(record.metrics, held, record.pool_scores)
    selected = record.selected_step
    why = ("the best held-out score (ties: the earliest step); training rows and pool scores are never used"
           if step == selected else f"asked for (rlvr export --step {step}); held-out selected step {selected}")
    gain = (f"{change_text(held[0], held[step], unit)} over step 0 ({held[0]:.3f} → {held[step]:.3f})"
            if 0 in held and step in held else "-")
    source = run.get("base_source") or {}
    lines = ["---", "library_name: peft", "tags: [rlvr, reinforcement-learning, lora]",
             *([f"base_model: {cfg.model.base}"] if cfg.model.base and not Path(cfg.model.base).exists()
               and not source.get("gguf_file") else []),
             "---", "", f"# {record.path.name if record.path else 'rlvr run'}: fine-tuned with rlvr", "",
             f"- base: `{base}`" + (f" (the model `{cfg.model.base}`, warm-started by the run)"
                                    if cfg.model.base and base.endswith(BASE_DIR) else ""),
             *([f"- GGUF file: `{source['gguf_file']}` (sha256 `{source.get('sha256')}`), dequantised to float32 "
                "before training"] if source.get("gguf_file") else []),
             f"- checkpoint: step {step} (the run trained {max(record.pool_scores, default=0)} steps); chosen as {why}",
             f"- held-out gain: {gain}", "", "## Evaluations", "", *_evaluations(record), "",
             "## Data", "", *_data(cfg, run.get("split") or {}), "",
             "## Run", "",
             f"- config sha256: `{run.get('config_sha256', '?')}` (the full config is config.json in the run folder)",
             f"- rlvr {run.get('rlvr_version', '?')}; "
             + ", ".join(f"{k} {v}" for k, v in sorted((run.get("versions") or {}).items())), "",
             "## Use", "", "```python", *_use(base, gguf=bool(source.get("gguf_file"))), "```", "",
             "`merged/` holds the same weights with the adapter merged in; `rlvr serve merged` serves it.", ""]
    return "\n".join(lines)


def _use(base: str, gguf: bool) -> list[str]:
    if gguf:  # transformers loads a GGUF base only through its own file argument: the merged model is simpler
        return ["from transformers import AutoModelForCausalLM", "",
                "model = AutoModelForCausalLM.from_pretrained(\"merged\")  # the base is a GGUF file"]
    return ["from peft import PeftModel", "from transformers import AutoModelForCausalLM", "",
            f"base = AutoModelForCausalLM.from_pretrained({base!r})",
            "model = PeftModel.from_pretrained(base, \"adapter\")"]
