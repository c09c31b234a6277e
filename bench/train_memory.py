"""Peak memory of one train step under each memory lever, against the old layout, in one run.

On a run config's policy (default ``examples/smollm2.toml``: SmolLM2-135M-Instruct, LoRA r16;
``--full`` for a full fine-tune) and ``--rows`` rows of ``--new-tokens`` completion tokens each
(``group_k`` rows per prompt, prompts from the config's task, completion ids drawn at random: every
row at the budget, the worst case), one ``TorchTrainer`` call runs per configuration:

- ``main``: the code of ``--baseline`` (a git ref, default ``main``; its ``src`` extracted with ``git
  archive``), ``micro_batch = --micro-batch``: the layout this branch replaces, run as it ships;
- ``logits``: this code with the output head's [tokens, vocabulary] logits made whole, as before the
  chunked head (the path a model without a plain body/head split takes), same micro-batch;
- ``chunked``: the head and log-softmax in chunks with their own backward (the default), same micro-batch;
- ``chunked+ckpt``: and ``gradient_checkpointing = true``;
- ``auto``, ``auto+ckpt``: ``micro_batch = "auto"`` at ``--budget-frac``, every other setting at its
  default (on CPU that gives freed blocks back at once: ``release_freed_memory`` unset);
- ``auto+keep``: ``"auto"`` with ``release_freed_memory = false`` (glibc's heap keeps what it freed);
- ``chunked+ckpt+release``, ``auto+ckpt+release``: ``release_freed_memory = true`` (glibc's heap
  gives freed blocks back at once: the RSS follows the live tensors; see backends/train/heap.py).

Each configuration runs in a fresh process (peak RSS is per process; the kernel's high-water mark
is reset with ``/proc/self/clear_refs`` once the policy is loaded, so the peak is the step's plus
what was resident before it). Prints per configuration: peak RSS during the step, its ratio to
``main``, the step's own part of it (peak less the RSS before the step), the micro-batch used
(and the sizer's estimate and budget under ``auto``), the step's seconds, and the largest gradient
difference against ``main`` relative to the largest gradient entry (gradient clipping off: the
raw gradient of the step's loss). The machine may be shared: peaks are per process and hold;
seconds are indicative only (``bench/real_model.py`` times).

    python bench/train_memory.py [--config examples/smollm2.toml] [--rows 64] [--new-tokens 64]
                                 [--micro-batch 256] [--budget-frac 0.25] [--full] [--only auto,chunked]
                                 [--baseline main]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
CONFIGS = {  # name: (logits made whole, micro_batch or "auto", gradient checkpointing, release_freed_memory)
    "main": (False, None, False, False),  # run on the baseline's code (its own layout; no memory levers there)
    "logits": (True, None, False, False),
    "chunked": (False, None, False, False),
    "chunked+ckpt": (False, None, True, False),
    "auto": (False, "auto", False, None),  # None: the default (on with "auto" on CPU)
    "auto+ckpt": (False, "auto", True, None),
    "auto+keep": (False, "auto", False, False),  # "auto" with glibc's heap left as it is
    "chunked+ckpt+release": (False, None, True, True),
    "auto+ckpt+release": (False, "auto", True, True),
}
GRAD_SAMPLE = 1 << 16  # gradient entries kept per parameter for the comparison


def status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {field}")


def rollouts_for(cfg, policy, rows: int, new_tokens: int):
    from rlvr.backends.model.tokenizer import HFChatTokenizer
    from rlvr.testing import batch_of
    from rlvr.types import Rollout
    from rlvr.wiring.tasks import task_tasks

    tasks, _ = task_tasks(cfg)
    chat, k = HFChatTokenizer(policy.tokenizer), cfg.loop.group_k
    vocab = policy.model.get_input_embeddings().weight.shape[0]
    draw = torch.Generator().manual_seed(0)
    out = []
    for i in range(rows):
        prompt = chat.render(tasks[i // k].messages)
        completion = torch.randint(3, vocab, (new_tokens,), generator=draw).tolist()
        out.append(Rollout(task_id=str(i // k), prompt_ids=tuple(prompt), completion_ids=tuple(completion),
                           logprobs=(-1.0,) * new_tokens, text="", messages=()))
    return batch_of(out, [1.0 if i % 3 else -0.5 for i in range(rows)])


def child(args: argparse.Namespace) -> None:
    """One configuration, one train call; its figures as JSON on the last line, its gradients in a file."""
    from rlvr.backends.model import precision
    from rlvr.backends.model.policy import LoraSpec, Policy
    from rlvr.backends.train.trainer import TorchTrainer
    from rlvr.config.run import load_run_config

    whole, micro, ckpt, release = CONFIGS[args.child]
    cfg = load_run_config(args.config)
    threads = int(os.environ.get("BENCH_THREADS", 0)) or cfg.model.threads  # BENCH_THREADS: a busy machine's 1
    torch.set_num_threads(threads or min(2, torch.get_num_threads()))
    lora = None if args.full or not cfg.loop.lora_rank else LoraSpec(
        rank=cfg.loop.lora_rank, alpha=cfg.train.lora_alpha, targets=tuple(cfg.train.lora_targets))
    policy = Policy(str(policy_base(cfg, Path(args.grads).parent)), lora=lora, need_reference=False, seed=0)
    batch = rollouts_for(cfg, policy, args.rows, args.new_tokens)
    if whole:  # every forward runs the model whole: its logits made for every scored position at once
        precision.split_head = lambda model: None
    levers = {} if args.child == "main" else {"gradient_checkpointing": ckpt, "memory_budget_frac": args.budget_frac,
                                              "release_freed_memory": release,
                                              "memory_floor_frac": 0.05}
    trainer = TorchTrainer(policy, lr=1e-12, max_grad_norm=1e30, temperature=cfg.loop.temp,
                           micro_batch=micro or args.micro_batch, **levers)
    grads: dict[str, torch.Tensor] = {}

    def keep_grads(optimizer, *_):
        for name, p in policy.model.named_parameters():
            if p.grad is not None:
                grads[name] = p.grad.detach().reshape(-1)[:: max(1, p.numel() // GRAD_SAMPLE)].clone()

    trainer.optimizer.register_step_pre_hook(keep_grads)
    before = status_kib("VmRSS")
    Path("/proc/self/clear_refs").write_text("5")  # the high-water mark from here on
    start = time.perf_counter()
    metrics = trainer(batch)
    seconds = time.perf_counter() - start
    torch.save(grads, args.grads)
    out = {"peak_gib": status_kib("VmHWM") / 2**20, "before_gib": before / 2**20, "seconds": seconds,
           "heap": getattr(trainer, "heap", "default"),
           "micro_batch": metrics.get("train/micro_batch", trainer.micro_batch),
           "estimate_gib": metrics.get("train/memory_estimate_gib"),
           "budget_gib": metrics.get("train/memory_budget_gib")}
    print(json.dumps(out))


def policy_base(cfg, scratch: Path) -> Path:
    """The config's base model folder; a tiny model is built (room for 512 positions: the longest rows)."""
    from rlvr.backends.model.sources import resolve_base
    from rlvr.backends.model.tiny import build_tiny_model

    if not cfg.model.tiny:
        return Path(resolve_base(cfg.model.base).path)
    m = cfg.model
    return build_tiny_model(scratch / "tiny", hidden=m.hidden, layers=m.layers, heads=m.heads, seed=m.init_seed,
                            max_positions=512)


def baseline_commit(ref: str) -> str:
    return subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", ref], capture_output=True, text=True,
                          check=True).stdout.strip()


def extract_src(ref: str, into: Path) -> Path:
    """``ref``'s committed ``src`` folder under ``into`` (what the main row imports)."""
    into.mkdir(parents=True)
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", ref, "src"], capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into / "src"


def compare(grads: dict[str, torch.Tensor], base: dict[str, torch.Tensor]) -> float:
    """Largest |difference| over the kept entries, relative to the largest |entry| of the baseline."""
    if grads.keys() != base.keys():
        return float("inf")
    scale = max(float(g.abs().max()) for g in base.values())
    return max(float((grads[n] - base[n]).abs().max()) for n in base) / scale


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default=str(ROOT / "examples" / "smollm2.toml"))
    ap.add_argument("--rows", type=int, default=64)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--micro-batch", type=int, default=256, help="the fixed micro-batch of the non-auto rows")
    ap.add_argument("--budget-frac", type=float, default=0.25, help="train.memory_budget_frac of the auto rows")
    ap.add_argument("--full", action="store_true", help="full fine-tune instead of the config's LoRA")
    ap.add_argument("--only", default=",".join(CONFIGS), help="configurations to run (main always runs)")
    ap.add_argument("--baseline", default="main", help="the git ref (or a src folder) whose code the main row runs; "
                    "'none': no main row (gradients compared with the first row, or with --keep's main.pt)")
    ap.add_argument("--keep", help="a folder to keep each row's sampled gradients in (name.pt)")
    ap.add_argument("--repeats", type=int, default=1, help="interleaved rounds (the median seconds are printed)")
    ap.add_argument("--child", choices=sorted(CONFIGS), help=argparse.SUPPRESS)
    ap.add_argument("--grads", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return child(args)
    names = ([] if args.baseline == "none" else ["main"]) + [n for n in args.only.split(",")
                                                             if n in CONFIGS and n != "main"]
    where = (args.baseline if args.baseline == "none" or Path(args.baseline).is_dir()
             else f"{args.baseline} ({baseline_commit(args.baseline)})")
    print(f"{Path(args.config).name}: {args.rows} rows x {args.new_tokens} new tokens, "
          f"{'full fine-tune' if args.full else 'LoRA'}; fixed micro_batch {args.micro_batch}, "
          f"auto at memory_budget_frac {args.budget_frac}; main = {where}; one process per row", flush=True)
    print(f"{'configuration':<21} {'peak GiB':>8} {'vs main':>9} {'step GiB':>8} {'micro':>5} "
          f"{'est/budget GiB':>15} {'seconds':>7} {'grad diff':>9}", flush=True)
    seconds: dict[str, list[float]] = {name: [] for name in names}
    with tempfile.TemporaryDirectory() as tmp:
        baseline_src = (Path(args.baseline) if args.baseline == "none" or Path(args.baseline).is_dir()
                        else extract_src(args.baseline, Path(tmp) / "baseline"))
        kept_main = Path(args.keep or tmp) / "main.pt"
        base = None
        if args.baseline == "none" and kept_main.exists():  # compared with an earlier run's main row
            base = ({"peak_gib": float("nan")}, torch.load(kept_main))
        for _ in range(args.repeats):
            for name in names:
                row, kept = run_child(args, name, Path(tmp) / f"{name}.pt", baseline_src)
                if row is None:
                    continue
                base = base or (row, kept)
                if args.keep:
                    Path(args.keep).mkdir(parents=True, exist_ok=True)
                    torch.save(kept, Path(args.keep) / f"{name}.pt")
                seconds[name].append(row["seconds"])
                print_row(name, row, base[0], compare(kept, base[1]))
    if args.repeats > 1 and "main" in seconds:
        print("median seconds: " + ", ".join(f"{n} {statistics.median(s):.1f}" for n, s in seconds.items() if s)
              + f" (ratio to main {statistics.median(seconds[names[-1]]) / statistics.median(seconds['main']):.3f}"
              f" for {names[-1]})")


def run_child(args: argparse.Namespace, name: str, grads: Path, baseline_src: Path):
    """One configuration in a fresh process: its figures and its kept gradients (``None, None`` if it failed)."""
    cmd = [sys.executable, __file__, "--child", name, "--grads", str(grads), "--config", args.config,
           "--rows", str(args.rows), "--new-tokens", str(args.new_tokens), "--micro-batch",
           str(args.micro_batch), "--budget-frac", str(args.budget_frac)] + (["--full"] if args.full else [])
    env = dict(os.environ, PYTHONPATH=str(baseline_src if name == "main" else ROOT / "src"))
    done = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if done.returncode:
        print(f"{name}: failed\n{done.stderr[-3000:]}", flush=True)
        return None, None
    return json.loads(done.stdout.strip().splitlines()[-1]), torch.load(grads)


def print_row(name: str, row: dict, base: dict, grad_diff: float) -> None:
    sizing = f"{row['estimate_gib']:.2f}/{row['budget_gib']:.2f}" if row["estimate_gib"] is not None else "-"
    print(f"{name:<21} {row['peak_gib']:>8.2f} {row['peak_gib'] / base['peak_gib']:>8.2f}x "
          f"{row['peak_gib'] - row['before_gib']:>8.2f} {row['micro_batch']:>5.0f} {sizing:>15} "
          f"{row['seconds']:>7.1f} {grad_diff:>9.1e}", flush=True)


if __name__ == "__main__":
    main()
