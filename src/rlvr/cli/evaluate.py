"""``rlvr eval DIR``: a run's selected (or any) checkpoint scored with pass@k and mean@n.

The policy is the run's own (:func:`~rlvr.wiring.seams.make_policy` on the run's base, weights from
the checkpoint through the trainer's ``load``), and so is each episode: the held-out evaluator
of :func:`~rlvr.wiring.seams.heldout_evaluator`, at the temperature asked for. The tasks are the
run's held-out split, rebuilt from the saved config and checked against run.json's split hashes
(the same split, or a refusal; the rows its evaluations scored, under ``loop.heldout_max_rows``),
or any ``task.data`` spec (``--data``) rewarded by the run's environment. Sample 0 at temperature 0
is the run's own held-out episode, so greedy pass@1 on held-out equals the recorded held-out score
of that step (binary rewards). A ``--data`` report says how many of its rows are the run's training
or held-out rows or near-duplicates of them (``overlap``), as run.json does for ``task.eval_data``: a score on rows the
checkpoint was trained on is reported, never passed off.
Part of the composition root: imports backends.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from rlvr.backends.model.tokenizer import HFChatTokenizer
from rlvr.config.run import RunConfig
from rlvr.data.fingerprints import near_matches, parts_of
from rlvr.data.normal import SHORT_KEY, split_key
from rlvr.data.normal_v1 import row_key
from rlvr.data.readers import read_tasks
from rlvr.data.split import rule_of
from rlvr.data.subsample import evaluation_rows
from rlvr.data.tasks import carve, other_split_reason
from rlvr.data.twins import twins_of
from rlvr.envs.trl import needs_answer
from rlvr.errors import RecordError, UsageError
from rlvr.record.checkpoints import require_sound
from rlvr.record.lineage import run_keys
from rlvr.record.run_record import TRAINER_DIR, checkpoint_name, disk_errors, read_record, write_json_atomic
from rlvr.run.passk import sample_rewards, summarise
from rlvr.types import Task
from rlvr.wiring.base_trust import run_base
from rlvr.wiring.fields import field_map
from rlvr.wiring.levers import shown
from rlvr.wiring.sampler import heldout_evaluator
from rlvr.wiring.seams import saved_config
from rlvr.wiring.tasks import run_tasks
from rlvr.wiring.trainer import make_policy, make_trainer


def eval_tasks(cfg: RunConfig, run: dict[str, Any], data: str | None, env: str | None) -> tuple[list[Task], Any]:
    """The tasks to score and the run's environment(s): its held-out split, or ``data``'s rows."""
    tasks, envs = run_tasks(cfg)
    if data is None:
        recorded = run.get("split", {})
        split = carve(tasks, cfg.loop.heldout_frac, cfg.loop.split_salt, cfg.loop.corpus_min, rule_of(recorded))
        if recorded.get("heldout_hash") not in (None, split.manifest["heldout_hash"]):
            why = other_split_reason(recorded)
            raise RecordError(f"the saved config no longer gives this run's held-out split ({why}); score a file "
                              "with --data instead")
        # The rows every evaluation of the run scored (all of them, under loop.heldout_max_rows).
        return list(evaluation_rows(split, cfg.loop.heldout_max_rows, train_eval=False).heldout), envs
    section = cfg.task if not cfg.envs else cfg.envs.get(env or "")
    scoring = envs.get(env) if cfg.envs else envs[None]
    rows = read_tasks(data, fields=field_map(section) if section is not None else None,
                      max_row_bytes=(section or cfg.task).max_row_bytes(),
                      require_answer=scoring is None or needs_answer(scoring))
    if not cfg.envs:
        return rows, envs
    if env not in cfg.envs:
        raise UsageError(f"--env: this run has environments {sorted(cfg.envs)}; name the one whose reward "
                         f"scores {data} (got {env!r})")
    return [dataclasses.replace(t, id=f"{env}/{t.id}", env=env) for t in rows], envs


def evaluate(run_dir: Path, *, step: int | None = None, data: str | None = None, env: str | None = None,
             n: int = 4, temperature: float = 1.0, threshold: float = 1.0) -> dict[str, Any]:
    """Score checkpoint ``step`` (default: the selected one) with ``n`` episodes per task."""
    if n < 1:
        raise UsageError(f"--n {n}: at least one sample per task")
    if temperature < 0:
        raise UsageError(f"--temperature {temperature}: must be >= 0 (0 is greedy)")
    cfg, record = saved_config(run_dir), read_record(run_dir)
    step = record.selected_step if step is None else step
    if step is None:
        raise RecordError(f"{run_dir}: no checkpoint was selected yet; pass --step N")
    ckpt = run_dir / checkpoint_name(step) / TRAINER_DIR
    if not ckpt.exists():
        raise RecordError(f"{run_dir}: checkpoint of step {step} is not on disk (pruned or never written)")
    require_sound(ckpt.parent)
    tasks, envs = eval_tasks(cfg, record.run, data, env)
    tasks = shown(cfg, tasks)  # with the system prompt the run showed its rows
    policy = make_policy(cfg, run_base(run_dir, cfg, record.run), need_reference=False)
    make_trainer(cfg, policy).load(str(ckpt))
    tokenizer = HFChatTokenizer(policy.tokenizer, template_kwargs=cfg.template_kwargs())
    closers: list[Any] = []
    try:
        rewards = sample_rewards(
            lambda j: heldout_evaluator(cfg, policy, tokenizer, envs, closers, temperature=temperature, seed_offset=j),
            step, tasks, n)
    finally:
        for close in closers:
            close()
    return {"run": str(run_dir), "step": step, "version": policy.version,
            "data": data or "held-out split", "n": n, "temperature": temperature, "pass_threshold": threshold,
            "recorded_heldout_score": record.heldout_scores.get(step) if data is None else None,
            **({"overlap": data_overlap(run_dir, cfg, record.run, tasks)} if data is not None else {}),
            **summarise(rewards, n, threshold)}


def data_overlap(run_dir: Path, cfg: RunConfig, run: dict[str, Any], tasks: list[Task]) -> dict[str, Any]:
    """How many of ``tasks`` are the run's training rows, its held-out rows, or rows the scored weights
    were trained on at all (the base's included): the same question or a near-duplicate of one, as the
    split and run.json's ``eval_sets`` count them. From the run's lineage file, else from its split
    rebuilt from the config."""
    keys = run_keys(run_dir)
    if keys is None:  # a run from before lineage files: its split as the saved config gives it
        recorded = run.get("split", {})
        split = carve(run_tasks(cfg)[0], cfg.loop.heldout_frac, cfg.loop.split_salt, cfg.loop.corpus_min,
                      rule_of(recorded))
        if recorded.get("heldout_hash") not in (None, split.manifest["heldout_hash"]):
            return {"n": len(tasks), "counted": False,
                    "why": "the saved config no longer gives this run's split (its data changed since the run)"}
        in_train, in_heldout = twins_of([split.train, split.heldout], tasks)
        return {"n": len(tasks), "counted": True, "in_train": sum(in_train), "in_heldout": sum(in_heldout),
                "in_trained_on": sum(in_train)}
    return {"n": len(tasks), "counted": True, **{f"in_{side}": _seen(tasks, keys, side)
                                                  for side in ("train", "heldout", "trained_on")}}


def _seen(tasks: list[Task], keys: dict[str, Any], side: str) -> int:
    """How many of ``tasks`` a lineage file's ``side`` holds, by key or as a near-duplicate (a format-1
    file, and what a run inherited from one, keys rows by prompt and answer)."""
    legacy = set(keys[side]) if keys["legacy"] else set(keys["trained_on_v1"]) if side == "trained_on" else set()
    prompts = set() if keys["legacy"] else set(keys[side])
    near = near_matches(tasks, parts_of(keys["near"][side]))
    return sum(1 for t, n in zip(tasks, near, strict=True)
               if n or split_key(t)[:SHORT_KEY] in prompts or (legacy and row_key(t)[:SHORT_KEY] in legacy))


def write_eval(report: dict[str, Any], out: Path) -> None:
    with disk_errors(f"{out}", "free space and evaluate again"):
        out.parent.mkdir(parents=True, exist_ok=True)
        write_json_atomic(out, report)
