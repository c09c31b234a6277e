"""Time-to-accuracy of rlvr's GRPO against TRL's GRPOTrainer, same model, task and group shape, one run.

Both libraries start from one shared base, built once in this process exactly as ``rlvr train``
builds it for the example config: the tiny model and tokenizer, the addition rows, the held-out
split (``loop.heldout_frac`` / ``loop.split_salt``) and the SFT warm start on the training split
(:func:`rlvr.cli.warm_start.prepare_base`). Then, one after the other on the same threads:

- rlvr: the example's GRPO (``build_seams`` + :class:`rlvr.RLLoop`, run folder and checkpoints
  included, as ``rlvr train`` does them);
- TRL: ``GRPOTrainer`` on the same base folder, matched as closely as TRL allows: full fine-tune,
  same lr (constant schedule, AdamW, grad-norm clip 1.0), temperature, ``num_generations = group_k``,
  ``tasks_per_step`` prompts and one optimizer step per generation batch, same completion length,
  no KL, ``scale_rewards="group"`` (std-normalised group advantages) and ``loss_type="dapo"``
  (token mean over the whole batch, rlvr's ``token-mean``); fp32, no gradient checkpointing, no
  vLLM, no saving, no logging.

Held-out accuracy is measured for both by the same function (:func:`rlvr.backends.train.sft.greedy_accuracy`
over the same held-out rows) at step 0 and every ``loop.heldout_every`` optimizer steps. Each
library's clock starts at its step-0 evaluation and *excludes* every held-out evaluation; for rlvr
it includes the run record and checkpoint writes that ``rlvr train`` always does. Prints both
curves, time to step-0 accuracy + 10 and + 15 points (the second is the headline), the ratio TRL
time / rlvr time, and steps per second.

    python bench/trl_compare.py [--steps 200] [--threads 2] [--seed 0] [--eval-every 10] [--gains 0.10,0.15]
        [--config examples/addition.toml]
"""

from __future__ import annotations

import argparse
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from rlvr.backends.model.io import load_model, load_tokenizer
from rlvr.backends.train.sft import greedy_accuracy
from rlvr.cli.settings import RunConfig, load_run_config
from rlvr.cli.warm_start import prepare_base, reward_value
from rlvr.cli.wiring import build_seams, task_tasks
from rlvr.data.tasks import carve
from rlvr.run.loop import RLLoop
from rlvr.types import LoadedEnv, Split

Curve = list[tuple[int, float, float]]  # (optimizer step, seconds since start excluding evals, held-out accuracy)


class EvalClock:
    """Wall clock of one library's RL run with held-out evaluation time taken out."""

    def __init__(self, name: str):
        self.name, self.t0, self.eval_s, self.curve = name, None, 0.0, []  # type: ignore[var-annotated]

    def evaluate(self, step: int, score: Callable[[], float]) -> float:
        now = time.perf_counter()
        if self.t0 is None:
            self.t0 = now
        elapsed = now - self.t0 - self.eval_s
        accuracy = score()
        self.eval_s += time.perf_counter() - now
        self.curve.append((step, elapsed, accuracy))
        print(f"  [{self.name}] step {step:4d}  {elapsed:7.1f}s  held-out {accuracy:.3f}", flush=True)
        return accuracy


def heldout_scorer(model: Any, tokenizer: Any, rows: list[dict[str, Any]], reward_fn: Callable[..., float],
                   max_new_tokens: int) -> Callable[[], float]:
    return lambda: greedy_accuracy(model, tokenizer, rows, reward_fn, max_new_tokens=max_new_tokens)


def run_rlvr(cfg: RunConfig, base: Path, split: Split, env: LoadedEnv,
             heldout_rows: list[dict[str, Any]], run_dir: Path) -> EvalClock:
    seams = build_seams(cfg, base, env)
    policy, clock = seams["policy"], EvalClock("rlvr")
    score = heldout_scorer(policy.model, policy.tokenizer, heldout_rows, reward_value(env), cfg.sampler.max_new_tokens)

    def heldout_eval(step: int, tasks: list[Any]) -> float:
        assert len(tasks) == len(heldout_rows), "rlvr's held-out split differs from the benchmark's"
        return clock.evaluate(step, score)

    loop = RLLoop(cfg.loop, env, split, rollout_fn=seams["plans"][None].rollout_fn, trainer=seams["trainer"],
                  weight_sync=seams["weight_sync"], heldout_eval=heldout_eval, out_dir=run_dir)
    loop.run()
    return clock


def run_trl(cfg: RunConfig, base: Path, train_rows: list[dict[str, Any]], reward_fn: Callable[..., float],
            heldout_rows: list[dict[str, Any]], out_dir: Path) -> tuple[EvalClock, str]:
    import trl
    from datasets import Dataset
    from transformers import PrinterCallback, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    loop = cfg.loop
    model = load_model(str(base), dtype="float32")
    tokenizer = load_tokenizer(str(base))
    clock = EvalClock("trl ")
    score = heldout_scorer(model, tokenizer, heldout_rows, reward_fn, cfg.sampler.max_new_tokens)

    def addition_reward(prompts: list, completions: list, answer: list, **_: Any) -> list[float]:
        # Conversational dataset: prompts and completions are message lists.
        return [reward_fn([*p, *c], a) for p, c, a in zip(prompts, completions, answer, strict=True)]

    class HeldoutCallback(TrainerCallback):
        def on_train_begin(self, args, state, control, **kwargs):
            clock.evaluate(0, score)

        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step % loop.heldout_every == 0 or state.global_step == state.max_steps:
                clock.evaluate(state.global_step, score)

    batch = loop.tasks_per_step * loop.group_k
    args = GRPOConfig(
        output_dir=str(out_dir),
        max_steps=loop.max_steps,
        learning_rate=loop.lr,
        lr_scheduler_type="constant",        # rlvr: constant lr, no warmup
        warmup_steps=0,
        weight_decay=cfg.train.weight_decay,
        max_grad_norm=cfg.train.max_grad_norm,
        optim="adamw_torch",
        per_device_train_batch_size=batch,    # 32 prompts x 8 completions in one optimizer step
        gradient_accumulation_steps=1,
        generation_batch_size=batch,          # -> steps_per_generation = 1: generate every step, on-policy
        num_iterations=1,
        num_generations=loop.group_k,
        max_completion_length=cfg.sampler.max_new_tokens,
        temperature=loop.temp,
        top_p=cfg.sampler.top_p,
        top_k=0,
        beta=loop.kl_coef,
        loss_type="dapo",                     # sum over all completion tokens / their count = rlvr token-mean
        scale_rewards="group",                # (r - group mean) / (group std + 1e-4), unbiased std
        use_vllm=False,
        use_cpu=True,
        bf16=False,
        fp16=False,
        gradient_checkpointing=False,
        seed=loop.seed,
        data_seed=loop.seed,
        save_strategy="no",
        logging_strategy="no",
        report_to="none",
        disable_tqdm=True,
        log_completions=False,
        dataloader_num_workers=0,
    )
    dataset = Dataset.from_list([{"prompt": r["prompt"], "answer": r["answer"]} for r in train_rows])
    trainer = GRPOTrainer(model=model, reward_funcs=addition_reward, args=args, train_dataset=dataset,
                          processing_class=tokenizer, callbacks=[HeldoutCallback()])
    trainer.remove_callback(PrinterCallback)  # "logging minimal": no end-of-training metrics dump
    trainer.train()
    return clock, trl.__version__


def first_reaching(curve: Curve, threshold: float) -> tuple[int, float] | None:
    for step, elapsed, accuracy in curve:
        if accuracy >= threshold - 1e-12:
            return step, elapsed
    return None


def report(clocks: dict[str, EvalClock], baseline: float, gains: list[float]) -> None:
    for name, clock in clocks.items():
        curve = clock.curve
        steps, seconds = curve[-1][0], curve[-1][1]
        best = max(curve, key=lambda p: (p[2], -p[0]))
        print(f"\n{name}: held-out at step 0 {curve[0][2]:.3f}; best {best[2]:.3f} at step {best[0]} ({best[1]:.1f}s); "
              f"{steps} steps in {seconds:.1f}s = {steps / seconds:.3f} steps/s (evaluation excluded, "
              f"{clock.eval_s:.1f}s of it)")
        print("  step " + " ".join(f"{s:6d}" for s, _, _ in curve))
        print("  sec  " + " ".join(f"{t:6.1f}" for _, t, _ in curve))
        print("  acc  " + " ".join(f"{a:6.3f}" for _, _, a in curve))
    if len(clocks) < 2:
        return
    print()
    for gain in gains:
        threshold = baseline + gain
        hits = {name: first_reaching(c.curve, threshold) for name, c in clocks.items()}
        parts = []
        for name, hit in hits.items():
            parts.append(f"{name} step {hit[0]} at {hit[1]:.1f}s" if hit else
                         f"{name} not reached in {clocks[name].curve[-1][0]} steps ({clocks[name].curve[-1][1]:.1f}s)")
        rl, tr = hits["rlvr"], hits["trl"]
        if rl and tr:
            ratio = f"{tr[1] / rl[1]:.2f}" if rl[1] > 0 else "n/a"
        elif rl:
            ratio = f"> {clocks['trl'].curve[-1][1] / rl[1]:.2f} (TRL never reached it)" if rl[1] > 0 else "n/a"
        elif tr:
            ratio = f"< {tr[1] / clocks['rlvr'].curve[-1][1]:.2f} (rlvr never reached it)"
        else:
            ratio = "n/a (neither reached it)"
        print(f"time to held-out >= {threshold:.3f} (step 0 + {gain * 100:.0f} points): " + "; ".join(parts)
              + f"; TRL/rlvr = {ratio}")
    rl_c, tr_c = clocks["rlvr"].curve[-1], clocks["trl"].curve[-1]
    print(f"steps/s: rlvr {rl_c[0] / rl_c[1]:.3f}, trl {tr_c[0] / tr_c[1]:.3f}, "
          f"TRL/rlvr time per step = {(tr_c[1] / tr_c[0]) / (rl_c[1] / rl_c[0]):.2f}")


def main() -> None:
    import importlib.util

    if importlib.util.find_spec("trl") is None or importlib.util.find_spec("datasets") is None:
        raise SystemExit("bench/trl_compare.py compares against TRL: pip install trl datasets (keep your torch)")
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default=str(Path(__file__).resolve().parent.parent / "examples" / "addition.toml"))
    ap.add_argument("--steps", type=int, default=200, help="RL optimizer steps per library")
    ap.add_argument("--threads", type=int, default=2, help="torch.set_num_threads for everything")
    ap.add_argument("--seed", type=int, default=0, help="loop.seed: warm start, rlvr sampling, TRL seed")
    ap.add_argument("--eval-every", type=int, default=None,
                    help="held-out evaluation period in optimizer steps (default: the config's loop.heldout_every)")
    ap.add_argument("--gains", default="0.10,0.15",
                    help="accuracy gains over step 0 to time, comma-separated fractions (default 0.10,0.15)")
    ap.add_argument("--only", choices=["rlvr", "trl"], help="run one library (development)")
    ap.add_argument("--trl-first", action="store_true", help="run TRL before rlvr")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    import transformers

    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    warnings.filterwarnings("ignore", category=FutureWarning)
    overrides = [f"--loop.seed={args.seed}", f"--loop.max_steps={args.steps}", f"--model.threads={args.threads}"]
    if args.eval_every:
        overrides.append(f"--loop.heldout_every={args.eval_every}")
    cfg = load_run_config(args.config, overrides)
    tasks, env = task_tasks(cfg)
    reward_fn = reward_value(env)
    split = carve(tasks, cfg.loop.heldout_frac, cfg.loop.split_salt, cfg.loop.corpus_min)
    train, heldout = split.train, split.heldout
    as_rows = lambda tasks: [{"prompt": [dict(m) for m in t.messages], "answer": str(t.answer)} for t in tasks]  # noqa: E731
    train_rows, heldout_rows = as_rows(train), as_rows(heldout)
    print(f"config: {args.config}  threads: {args.threads}  seed: {args.seed}  steps: {args.steps}  "
          f"batch: {cfg.loop.tasks_per_step}x{cfg.loop.group_k}  eval every {cfg.loop.heldout_every}  "
          f"train/held-out rows: {len(train_rows)}/{len(heldout_rows)}")
    clocks: dict[str, EvalClock] = {}
    with tempfile.TemporaryDirectory(prefix="trl_compare_") as tmp:
        work = Path(tmp)
        started = time.perf_counter()
        base = prepare_base(cfg, work, split, env, log=lambda m: print("  " + m, flush=True))
        print(f"shared base ready in {time.perf_counter() - started:.1f}s: {base.name}/", flush=True)
        order = ["trl", "rlvr"] if args.trl_first else ["rlvr", "trl"]
        trl_version = None
        for name in order:
            if args.only and name != args.only:
                continue
            print(f"{name}: {args.steps} GRPO steps", flush=True)
            if name == "rlvr":
                clocks["rlvr"] = run_rlvr(cfg, base, split, env, heldout_rows, work / "rlvr_run")
            else:
                clocks["trl"], trl_version = run_trl(cfg, base, train_rows, reward_fn, heldout_rows, work / "trl_out")
    print(f"\ntorch {torch.__version__}, transformers {transformers.__version__}, trl {trl_version or '-'}")
    baselines = {name: c.curve[0][2] for name, c in clocks.items()}
    baseline = baselines.get("rlvr", next(iter(baselines.values())))
    if len(set(baselines.values())) > 1:
        print(f"WARNING: step-0 held-out differs between libraries: {baselines}")
    report({n: clocks[n] for n in ("rlvr", "trl") if n in clocks}, baseline,
           [float(g) for g in args.gains.split(",") if g.strip()])


if __name__ == "__main__":
    main()
