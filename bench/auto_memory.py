"""``micro_batch = "auto"``: the estimate a train step reports against the peak it reaches, per model and length.

For each run config (default: the demo's tiny model, ``examples/addition.toml``, and SmolLM2-135M-Instruct,
``examples/smollm2.toml``) and each ``--new-tokens`` length, one ``TorchTrainer`` call with
``micro_batch = "auto"`` and every other setting at its default (``bench/train_memory.py``'s ``auto``
row; ``--configs auto,auto+keep`` adds the row with glibc's heap left as it is) runs in a fresh
process on ``--rows`` rows (``group_k`` per prompt, completions of random ids, every row at the
length). The tiny model is trained in full, as the demo does, SmolLM2 with the config's LoRA.

Prints per run: the micro-batch the sizer chose, its budget and estimate (``train/memory_estimate_gib``:
what the step adds to the process), the step's measured peak (the kernel's RSS high-water mark,
reset when the step starts, less the RSS then), their ratio, and the step's seconds. Peaks are per
process and hold on a shared machine; seconds are indicative only.

    python bench/auto_memory.py [--models examples/addition.toml,examples/smollm2.toml]
                                [--new-tokens 64,256] [--rows 16] [--budget-frac 0.25] [--configs auto]
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import train_memory

ROOT = Path(__file__).resolve().parent.parent


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="examples/addition.toml,examples/smollm2.toml")
    ap.add_argument("--new-tokens", default="64,256")
    ap.add_argument("--rows", type=int, default=16)
    ap.add_argument("--budget-frac", type=float, default=0.25, help="train.memory_budget_frac (the default)")
    ap.add_argument("--configs", default="auto", help="bench/train_memory.py rows to run: auto, auto+ckpt, auto+keep")
    args = ap.parse_args()
    print(f"{args.rows} rows a step, memory_budget_frac {args.budget_frac}; one process per run", flush=True)
    print(f"{'model':<14} {'config':<10} {'new':>4} {'micro':>5} {'budget GiB':>10} {'estimate GiB':>12} "
          f"{'peak GiB':>8} {'peak/est':>8} {'seconds':>7}", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        for model in args.models.split(","):
            for new_tokens in map(int, args.new_tokens.split(",")):
                for name in args.configs.split(","):
                    run = argparse.Namespace(config=str(ROOT / model), rows=args.rows, new_tokens=new_tokens,
                                             micro_batch=256, budget_frac=args.budget_frac, full=False)
                    row, _ = train_memory.run_child(run, name, Path(tmp) / f"{name}.pt", ROOT / "src")
                    if row is None:
                        continue
                    step = row["peak_gib"] - row["before_gib"]
                    print(f"{Path(model).stem:<14} {name:<10} {new_tokens:>4} {row['micro_batch']:>5.0f} "
                          f"{row['budget_gib']:>10.2f} {row['estimate_gib']:>12.3f} {step:>8.3f} "
                          f"{step / row['estimate_gib']:>8.2f} {row['seconds']:>7.1f}", flush=True)


if __name__ == "__main__":
    main()
