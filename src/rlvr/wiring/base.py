"""The base a run starts from: ``model.base`` as loaded, or the tiny model built, then warm-started.

The warm start (SFT, optionally until greedy train accuracy reaches ``sft.target_accuracy``) is
given the *training* side of the run's split only: the split is carved once, before anything is
trained, and the held-out side never reaches this module. The result is saved as ``base/`` in the
run folder with a marker recording its recipe, so a resume reuses it and a different recipe is
refused. Part of the composition root: imports backends.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from rlvr.backends.model.io import load_model, load_tokenizer
from rlvr.backends.model.sources import BaseSource
from rlvr.backends.model.tiny import build_tiny_model
from rlvr.backends.train.checkpoint_io import write_failures
from rlvr.backends.train.sft import greedy_accuracy, sft_warm_start
from rlvr.config.run import RunConfig, TaskSection
from rlvr.errors import ConfigError, RecordError
from rlvr.protocols import LoadedEnv
from rlvr.record.run_record import disk_errors
from rlvr.reward import evaluate_reward
from rlvr.types import Split, Task

BASE_DIR = "base"
BASE_MARKER = "rlvr_base.json"


def reward_value(env: LoadedEnv) -> Callable[[list[dict[str, Any]], Task], float]:
    """The environment's reward as a plain float (0 where it does not apply), for SFT checks; the check
    rows carry their Task as the "answer", so a reward that reads the row sees it."""
    return lambda messages, task: evaluate_reward(env, messages, task.answer, task).value or 0.0


def sft_answer(env: LoadedEnv, answer: Any) -> str:
    """The text a warm start teaches for a row: the environment's own ``sft_answer(answer)`` where it
    defines one (a row answer that is not the reply itself, as a verifiers environment's), else the answer."""
    own = getattr(env.source, "sft_answer", None)
    return str(own(answer)) if callable(own) else str(answer)


def sft_text(task: Task, env: LoadedEnv, target: str | None) -> str:
    """What the warm start teaches for ``task``: its ``info[target]`` (``sft.target``; the pre-flight
    checked every training row has one) where set, else :func:`sft_answer`."""
    return sft_answer(env, task.answer) if target is None else str(task.info[target])


def prepare_base(cfg: RunConfig, run_dir: Path, split: Split, envs: Mapping[str | None, LoadedEnv],
                 log: Callable[[str], None], source: BaseSource | None = None) -> Path:
    """The folder the policy starts from: ``source`` (``model.base`` resolved to a loadable folder or
    hub name) as is, or a built tiny model, warm-started
    on ``split.train`` only (``envs``, name → environment, score the accuracy checks). A ``base/`` already in the run
    folder is reused only if its recipe, the training split's content hash included, is this one."""
    base = run_dir / BASE_DIR
    recipe = base_recipe(cfg, split)
    train = split.train
    if base.exists():
        marker = base / BASE_MARKER
        found = json.loads(marker.read_text()) if marker.exists() else None
        if found != recipe:
            changed = sorted(k for k in recipe.keys() | (found or {}).keys()
                             if (found or {}).get(k) != recipe.get(k))
            raise ConfigError(f"{base} was built for another corpus or config (differs in {changed}); a base "
                              "warm-started on other rows may have seen this split's held-out rows: remove it or "
                              "use another run folder")
        return base
    tmp = run_dir / (BASE_DIR + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    if cfg.model.tiny:
        m = cfg.model
        build_tiny_model(tmp, hidden=m.hidden, layers=m.layers, heads=m.heads, seed=m.init_seed)
        start = str(tmp)
    elif source is not None:
        start = source.path
    else:
        raise ConfigError("set model.base to a model name, folder or GGUF file, or model.tiny = true")
    if cfg.sft.steps == 0 and not cfg.model.tiny:
        return Path(start)  # nothing to change: train on the given base directly
    model = load_model(start, dtype=cfg.model.dtype, device=cfg.model.device)
    tokenizer = load_tokenizer(start)
    if cfg.sft.steps:
        stats = warm_start(cfg, model, tokenizer, train, envs, log)
        accuracy = f", train accuracy {stats['accuracy']:.3f}" if "accuracy" in stats else ""
        log(f"warm start: {stats['steps']} steps, loss {stats['loss_start']:.3f} -> {stats['loss']:.3f} "
            f"in {stats['seconds']:.1f}s{accuracy}")
    try:
        with disk_errors(f"the warm-started base {tmp}", "free space, then start the run again"), write_failures(tmp):
            model.save_pretrained(tmp)
            tokenizer.save_pretrained(tmp)
            (tmp / BASE_MARKER).write_text(json.dumps(recipe, sort_keys=True))
    except RecordError:
        shutil.rmtree(tmp, ignore_errors=True)  # give back what the half-written base took
        raise
    tmp.rename(base)
    return base


def base_recipe(cfg: RunConfig, split: Split) -> dict[str, Any]:
    """Everything that shapes the warm-started base: the content of both sides of the split (so a
    changed corpus can never reuse a base that may have seen today's held-out rows), the model, the
    task and the warm-start settings."""
    loop = cfg.loop
    return {"train_hash": split.manifest["train_hash"], "heldout_hash": split.manifest["heldout_hash"],
            "model": cfg.model.model_dump(mode="json", exclude={"threads", "device", "allow_heldout_overlap"}),
            "task": _shown_as(cfg.task), "sft": _sft_shown(cfg),
            **({"envs": {k: _shown_as(v) for k, v in cfg.envs.items()}} if cfg.envs else {}),
            "base": loop.base, "seed": loop.seed, "heldout_frac": loop.heldout_frac,
            "split_salt": loop.split_salt, "max_new_tokens": cfg.sampler.max_new_tokens}


def _sft_shown(cfg: RunConfig) -> dict[str, Any]:
    """The warm start's settings for the recipe; ``target`` only when set (as :func:`_shown_as` does)."""
    return cfg.sft.model_dump(mode="json", exclude={"target"} if cfg.sft.target is None else set())


def _shown_as(section: TaskSection) -> dict[str, Any]:
    """A task section for the recipe; how prompts are shown counts only when set, so a base built
    before those keys existed still matches a config that leaves them unset."""
    dumped = section.model_dump(mode="json", exclude={"max_row_mb"})  # a bound on reading, not the rows
    for key in ("system_prompt", "chat_template_kwargs"):
        if not dumped.get(key):
            dumped.pop(key, None)
    return dumped


def warm_start(cfg: RunConfig, model: Any, tokenizer: Any, train: Sequence[Task],
               envs: Mapping[str | None, LoadedEnv], log: Callable[[str], None]) -> dict[str, Any]:
    """SFT on ``train``, the training side of the run's split: held-out rows are never given to it.
    Its rows are shown as the run shows them (``system_prompt`` already on them, ``chat_template_kwargs``
    passed to every rendering).
    In a run of several environments, every environment's rows, and the accuracy check is the mean
    of each environment's own accuracy (its rows, its reward)."""
    template_kwargs = cfg.template_kwargs()  # prompts rendered as the run renders them
    sft_rows = [{"prompt": list(t.messages), "answer": sft_text(t, envs[t.env], cfg.sft.target)} for t in train]
    checks = {name: [{"prompt": list(t.messages), "answer": t} for t in train if t.env == name][: cfg.sft.check_rows]
              for name in envs}
    stop_when: Callable[[], bool] | None = None
    accuracy: dict[str, float] = {}
    if (target := cfg.sft.target_accuracy) is not None:
        def stop_when() -> bool:
            scores = [greedy_accuracy(model, tokenizer, rows, reward_value(envs[name]),
                                      max_new_tokens=cfg.completion_budget, template_kwargs=template_kwargs)
                      for name, rows in checks.items() if rows]
            accuracy["value"] = sum(scores) / len(scores)
            return accuracy["value"] >= target
    log(f"warm start: up to {cfg.sft.steps} SFT steps on {len(sft_rows)} training rows"
        + (f", until train accuracy >= {cfg.sft.target_accuracy}" if stop_when else ""))
    stats = sft_warm_start(model, tokenizer, sft_rows, steps=cfg.sft.steps, batch_size=cfg.sft.batch_size,
                           lr=cfg.sft.lr, seed=cfg.loop.seed, stop_when=stop_when, check_every=cfg.sft.check_every,
                           template_kwargs=template_kwargs)
    return {**stats, **({"accuracy": accuracy["value"]} if accuracy else {})}
