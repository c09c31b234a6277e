"""One library's side of ``bench/trl_compare.py``, run in a process of its own.

Each function here is one subprocess of the comparison: ``base`` prepares the shared starting
point once per seed, ``rlvr`` and ``trl`` each train from it and write a JSON result (held-out
curve, phase totals, peak RSS, the settings used). A process per library keeps each peak RSS its
own and lets nothing (allocator state, threads, patched methods) leak from one library to the other.

What both sides share, by construction: the config (``--config`` plus the same overrides), the
rows and the held-out split (carved from the config, checked by hash by the parent), the base
folder, the prompts (the environment's messages through the tokenizer's chat template; the TRL side
refuses to start if TRL would tokenize any prompt differently from rlvr), the reward (the
environment's, through :func:`rlvr.wiring.base.reward_value`) and the held-out evaluation
(:func:`rlvr.backends.train.sft.greedy_accuracy` over the held-out rows, at step 0 and every
``loop.heldout_every`` optimizer steps, its time taken out of each library's clock).
"""

from __future__ import annotations

import contextlib
import functools
import json
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from phase_timing import PhaseClock


class EvalClock:
    """Wall clock of one library's RL run with held-out evaluation time taken out; starts at the
    step-0 evaluation."""

    def __init__(self, name: str, score: Callable[[], float]):
        self.name, self.score = name, score
        self.t0: float | None = None
        self.eval_s = 0.0
        self.curve: list[tuple[int, float, float]] = []  # (optimizer step, seconds excluding evals, accuracy)

    def start(self) -> None:
        """Start the clock (at the first call): the run's time from here on counts."""
        if self.t0 is None:
            self.t0 = time.perf_counter()

    def evaluate(self, step: int) -> float:
        self.start()
        now = time.perf_counter()
        elapsed = now - self.t0 - self.eval_s
        accuracy = self.score()
        self.eval_s += time.perf_counter() - now
        self.curve.append((step, elapsed, accuracy))
        print(f"  [{self.name}] step {step:4d}  {elapsed:8.1f}s  held-out {accuracy:.3f}", flush=True)
        return accuracy


class EvalGate:
    """No generation while held-out is evaluated: evaluation is taken out of each library's clock,
    and rlvr's sampler, left alone, would sample the next batch during it (TRL's cannot), so that
    work would go uncounted. An evaluation first waits for generation in flight (that wait counts as
    run time), then holds new generation until it is done."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._evaluating, self._generating = False, 0

    def generation(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def gated(*args: Any, **kwargs: Any) -> Any:
            with self._cond:
                self._cond.wait_for(lambda: not self._evaluating)
                self._generating += 1
            try:
                return fn(*args, **kwargs)
            finally:
                with self._cond:
                    self._generating -= 1
                    self._cond.notify_all()
        return gated

    @contextlib.contextmanager
    def evaluation(self) -> Iterator[None]:
        with self._cond:
            self._evaluating = True
            self._cond.wait_for(lambda: self._generating == 0)
        try:
            yield
        finally:
            with self._cond:
                self._evaluating = False
                self._cond.notify_all()


def load_setup(config: str, overrides: list[str]) -> tuple[Any, Any, Any]:
    """(run config, environment, split) exactly as ``rlvr train`` carves them."""
    from rlvr.config.run import load_run_config
    from rlvr.data.tasks import carve
    from rlvr.wiring.tasks import run_tasks

    cfg = load_run_config(config, overrides)
    tasks, envs = run_tasks(cfg)
    if list(envs) != [None]:
        raise SystemExit(f"{config}: the comparison runs one [task] environment, not [envs.*] ({sorted(envs)})")
    return cfg, envs[None], carve(tasks, cfg.loop.heldout_frac, cfg.loop.split_salt, cfg.loop.corpus_min)


def heldout_scorer(model: Any, tokenizer: Any, split: Any, env: Any, max_new_tokens: int) -> Callable[[], float]:
    from rlvr.backends.train.sft import greedy_accuracy
    from rlvr.wiring.base import reward_value

    rows = [{"prompt": [dict(m) for m in t.messages], "answer": t} for t in split.heldout]
    reward = reward_value(env)
    return lambda: greedy_accuracy(model, tokenizer, rows, reward, max_new_tokens=max_new_tokens)


def run_base(config: str, overrides: list[str], work: Path) -> dict[str, Any]:
    """The folder both libraries start from, built as ``rlvr train`` builds it in the rlvr run's
    folder (a tiny model warm-started on the training split; a real base resolved, a GGUF file
    converted once into the cache), so rlvr's own run reuses it unchanged."""
    from rlvr.wiring.base import prepare_base
    from rlvr.wiring.seams import base_source

    cfg, env, split = load_setup(config, overrides)
    run_dir = work / "rlvr_run"
    run_dir.mkdir(parents=True, exist_ok=True)
    log = lambda m: print("  " + m, flush=True)  # noqa: E731
    base = prepare_base(cfg, run_dir, split, {None: env}, log, base_source(cfg, run_dir, log))
    return {"base": str(base)}


def run_rlvr(config: str, overrides: list[str], work: Path) -> dict[str, Any]:
    """rlvr as ``rlvr train`` runs it (``make_loop`` on the config: run folder, record, checkpoints),
    its held-out evaluator swapped for the shared one, with no generation beside it (:class:`EvalGate`).
    Phases: generate and score timed by wrapping the engine's batched sampler and the rollout
    stream's reward call; optimizer by wrapping the trainer's optimizer step; forward-backward is the
    run record's train time less the optimizer; sync is the record's weight-sync time."""
    from rlvr.backends.sample import engine as engine_module
    from rlvr.rollouts import stream as stream_module
    from rlvr.run.memory import peak_rss_mb
    from rlvr.wiring.seams import make_loop

    # The loop's own score of training rows (train_eval) would come through heldout_eval below, which
    # scores the held-out split: off, as TRL scores no training rows (evaluation is off both clocks).
    cfg, env, split = load_setup(config, [*overrides, "--loop.train_eval=false"])
    loop = make_loop(cfg, work / "rlvr_run", log=lambda m: print("  " + m, flush=True))
    policy = loop.trainer.policy
    scorer = heldout_scorer(policy.model, policy.tokenizer, split, env, cfg.completion_budget)
    clock = EvalClock("rlvr", scorer)

    gate = EvalGate()

    heldout_ids = [t.id for t in split.heldout]

    def heldout_eval(step: int, tasks: list[Any]) -> float:
        if [t.id for t in tasks] != heldout_ids:
            raise SystemExit(f"rlvr asked to score {len(tasks)} rows that are not the benchmark's held-out split "
                             f"({len(split.heldout)} rows)")
        clock.start()  # before the gate: generation it waits for (step 0's first batch) is run time
        with gate.evaluation():
            return clock.evaluate(step)

    loop.heldout_eval = heldout_eval
    phases = PhaseClock()
    phases.patch(engine_module, "sample_batch", "generate")
    engine_module.sample_batch = gate.generation(engine_module.sample_batch)
    phases.patch(stream_module, "evaluate_rewards_within", "score")
    phases.patch(loop.trainer.optimizer, "step", "optimizer")
    record = loop.run()
    metrics = record.metrics
    totals = phases.totals()
    train_s = sum(m["perf/train_time"] for m in metrics)
    totals.update({"forward-backward": train_s - totals.get("optimizer", 0.0),
                   "sync": sum(m["perf/weight_sync_time"] for m in metrics),
                   "sample_wait": sum(m["perf/sample_wait_time"] for m in metrics)})
    s, t = cfg.sampler, cfg.train
    settings = {"dtype": cfg.model.dtype, "threads": cfg.model.threads, "micro_batch": t.micro_batch,
                "batch": f"{cfg.loop.tasks_per_step} prompts x {cfg.loop.group_k}", "sampler": s.backend,
                "max_head_offpolicy_versions": cfg.loop.max_head_offpolicy_versions,
                "policy_loss": t.policy_loss, "aggregation": t.aggregation, "lora_rank": cfg.loop.lora_rank}
    return {"curve": clock.curve, "eval_s": clock.eval_s, "phases": totals, "peak_rss_mb": peak_rss_mb(),
            "heldout_hash": split.manifest["heldout_hash"], "settings": settings,
            "completion_len": _mean([m["rollout/completion_len"] for m in metrics])}


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else float("nan")


def write_result(path: Path, result: dict[str, Any]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(result, indent=1))
    tmp.rename(path)
