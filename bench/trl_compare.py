"""rlvr against TRL's GRPOTrainer on the same work: held-out accuracy against wall time, time per step
by phase, time to TRL's best held-out accuracy and peak RSS, per seed, in one run.

For each seed in ``--seeds``, three processes run one after the other (``bench/compare_runs.py``,
``bench/compare_trl.py``): one prepares the base both libraries start from, as ``rlvr train`` does
for the config (the tiny demo: the tiny model warm-started on the training split; the real-model
example, ``examples/smollm2.toml``: SmolLM2-135M-Instruct from its GGUF file, LoRA, no warm start);
then rlvr (exactly as ``rlvr train`` runs the config: whatever its defaults are) and TRL each train
``--steps`` optimizer steps from that base in a process of its own, so each peak RSS is its own and
nothing leaks between them. Both see the same rows, split, chat-templated prompts, reward, group
shape, completion budget, temperature, learning rate, LoRA and held-out evaluation function; each
library's clock starts at its step-0 evaluation and excludes every held-out evaluation (rlvr's
includes the run record and checkpoint writes ``rlvr train`` always does).

Prints, per seed and library: the held-out curve (step, seconds, accuracy); time per step and its
split into generate / score / forward-backward / optimizer / sync / other (how each is timed: the
two worker modules' docstrings); time to TRL's best held-out accuracy; peak RSS; the settings each
ran with; how long the process's threads queued for a core held by another process
(``bench/cpu_share.py``: from 10% of their runnable time, the run measured a busy machine and its
figures are flagged). Then the ratios the acceptance asks for, per seed and their mean: rlvr time
per step / TRL's, and rlvr time to TRL's best / TRL's time to it.

    python bench/trl_compare.py [--config examples/addition.toml] [--seeds 0,1] [--steps N]
        [--threads N] [--eval-every N] [--trl-precision fp32|bf16-amp] [--set SECTION.KEY=VALUE ...]
        [--only rlvr|trl] [--trl-first]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from cpu_share import describe_share
from phase_timing import PHASES, format_split, split_per_step

BENCH = Path(__file__).resolve().parent
LIBRARIES = ("rlvr", "trl")


def worker(args: argparse.Namespace) -> None:
    """The body of one subprocess: prepare the base, or train one library, and write the result."""
    import warnings

    import transformers

    from compare_runs import run_base, run_rlvr, write_result
    from cpu_share import CpuShare

    share = CpuShare()
    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    warnings.filterwarnings("ignore", category=FutureWarning)
    overrides, work = json.loads(args.overrides), Path(args.work)
    if args.worker == "base":
        result = run_base(args.config, overrides, work)
    elif args.worker == "rlvr":
        result = run_rlvr(args.config, overrides, work)
    else:
        from compare_trl import run_trl

        result = run_trl(args.config, overrides, work, args.base, args.trl_precision)
    import torch

    result["versions"] = {"torch": torch.__version__, "transformers": transformers.__version__}
    result["cpu_share"] = share.report()
    write_result(Path(args.result), result)


def spawn(name: str, args: argparse.Namespace, overrides: list[str], work: Path, base: str = "") -> dict[str, Any]:
    result = work / f"{name}.json"
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", name, "--config", args.config,
           "--overrides", json.dumps(overrides), "--work", str(work), "--result", str(result),
           "--base", base, "--trl-precision", args.trl_precision]
    done = subprocess.run(cmd, check=False)  # interrupted or terminated: the child is killed with it
    if done.returncode != 0 or not result.exists():
        raise SystemExit(f"the {name} process for {work.name} failed (exit status {done.returncode}); "
                         "its output is above")
    return json.loads(result.read_text())


def first_reaching(curve: list[list[float]], threshold: float) -> list[float] | None:
    return next((point for point in curve if point[2] >= threshold - 1e-12), None)


def describe(name: str, r: dict[str, Any]) -> dict[str, float]:
    """Print one library's run of one seed; return its time per step."""
    curve = r["curve"]
    steps, wall = int(curve[-1][0]), curve[-1][1]
    best = max(curve, key=lambda p: (p[2], -p[0]))
    print(f"\n{name}: held-out {curve[0][2]:.3f} at step 0, best {best[2]:.3f} at step {int(best[0])} "
          f"({best[1]:.1f}s); {steps} steps in {wall:.1f}s = {wall / max(steps, 1):.2f} s/step "
          f"(evaluation excluded: {r['eval_s']:.1f}s of it); peak RSS {r['peak_rss_mb']:.0f} MiB")
    print("  step " + " ".join(f"{int(s):7d}" for s, _, _ in curve))
    print("  sec  " + " ".join(f"{t:7.1f}" for _, t, _ in curve))
    print("  acc  " + " ".join(f"{a:7.3f}" for _, _, a in curve))
    print("  per step: " + format_split(split_per_step(r["phases"], wall, steps)))
    print("  settings: " + ", ".join(f"{k}={v}" for k, v in r["settings"].items()))
    if "cpu_share" in r:
        print("  " + describe_share(r["cpu_share"]))
    return {"per_step": wall / max(steps, 1)}


def compare(rl: dict[str, Any], tr: dict[str, Any]) -> dict[str, float | None]:
    """rlvr/TRL time per step, and rlvr's time to TRL's best held-out accuracy over TRL's."""
    out: dict[str, float | None] = {}
    rl_c, tr_c = rl["curve"], tr["curve"]
    per_step = lambda c: c[-1][1] / max(c[-1][0], 1)  # noqa: E731
    out["step"] = per_step(rl_c) / per_step(tr_c)
    best = max(p[2] for p in tr_c)
    tr_hit, rl_hit = first_reaching(tr_c, best), first_reaching(rl_c, best)
    line = f"TRL's best held-out {best:.3f}: TRL at step {int(tr_hit[0])} ({tr_hit[1]:.1f}s), "
    if rl_hit is None:
        line += f"rlvr never in {int(rl_c[-1][0])} steps ({rl_c[-1][1]:.1f}s)"
        out["best"] = None
    else:
        line += f"rlvr at step {int(rl_hit[0])} ({rl_hit[1]:.1f}s)"
        out["best"] = rl_hit[1] / tr_hit[1] if tr_hit[1] > 0 else None
    if tr_hit[1] == 0:
        line += " (TRL's best is its step-0 score: no time to compare)"
    print(line)
    return out


def spread(xs: list[float]) -> str:
    """Mean ± standard error over seeds, with the range (one seed: the value alone)."""
    if not xs:
        return "n/a"
    mean = sum(xs) / len(xs)
    if len(xs) == 1:
        return f"{mean:.3f}"
    se = (sum((x - mean) ** 2 for x in xs) / (len(xs) - 1)) ** 0.5 / len(xs) ** 0.5
    return f"{mean:.3f} ± {se:.3f} [{min(xs):.3f}, {max(xs):.3f}]"


def summarize(ratios: dict[int, dict[str, float | None]]) -> None:
    print("\nratios (rlvr / TRL; below 1: rlvr faster)")
    print("  seed  time per step  time to TRL's best")
    for seed, r in ratios.items():
        best = f"{r['best']:.3f}" if r.get("best") is not None else "n/a"
        print(f"  {seed:4d}  {r['step']:13.3f}  {best:>18}")
    steps = [r["step"] for r in ratios.values() if r["step"] is not None]
    bests = [r["best"] for r in ratios.values() if r.get("best") is not None]
    print(f"  time per step over {len(steps)} seed(s): {spread(steps)} (mean ± standard error [min, max])")
    print(f"  time to TRL's best over {len(bests)} of {len(ratios)} seed(s): {spread(bests)}"
          + ("" if len(bests) == len(ratios) else "; on the others rlvr never reached TRL's best in its steps"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default=str(BENCH.parent / "examples" / "addition.toml"))
    ap.add_argument("--seeds", default="0", help="comma-separated loop.seed values, one comparison each (default 0)")
    ap.add_argument("--steps", type=int, help="RL optimizer steps per library (default: the config's loop.max_steps)")
    ap.add_argument("--rlvr-steps", type=int, help="rlvr's steps when they differ from --steps (e.g. the steps it "
                    "takes in TRL's time, to see whether it reaches TRL's best there)")
    ap.add_argument("--threads", type=int, help="torch threads for both (default: the config's model.threads)")
    ap.add_argument("--eval-every", type=int, help="held-out period in steps (default: loop.heldout_every)")
    ap.add_argument("--trl-precision", choices=["fp32", "bf16-amp"],
                    help="TRL's precision (default: fp32 for model.dtype float32, else bf16 autocast)")
    ap.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                    help="a config override for both libraries, as `rlvr train --SECTION.KEY=VALUE` (repeatable)")
    ap.add_argument("--only", choices=LIBRARIES, help="run one library (development)")
    ap.add_argument("--trl-first", action="store_true", help="run TRL before rlvr")
    ap.add_argument("--worker", choices=["base", *LIBRARIES], help=argparse.SUPPRESS)
    for hidden in ("--overrides", "--work", "--result", "--base"):
        ap.add_argument(hidden, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        return worker(args)
    # A terminated comparison takes its running library down with it, rather than orphan it.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    missing = [m for m in ("trl", "datasets") if importlib.util.find_spec(m) is None]
    if args.only != "rlvr" and missing:
        raise SystemExit("bench/trl_compare.py compares against TRL: pip install 'rlvr[bench]' (keep your torch)")
    from rlvr.config.run import load_run_config

    extra = [f"--{item.removeprefix('--')}" for item in args.set]
    cfg = load_run_config(args.config, extra)  # a bad override fails here, naming the key
    if args.trl_precision is None:
        args.trl_precision = "fp32" if cfg.model.dtype == "float32" else "bf16-amp"
    common = [*extra, *([f"--loop.max_steps={args.steps}"] if args.steps else [])]
    common += [f"--model.threads={args.threads}"] if args.threads else []
    common += [f"--loop.heldout_every={args.eval_every}"] if args.eval_every else []
    seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    order = [n for n in (LIBRARIES[::-1] if args.trl_first else LIBRARIES) if not args.only or n == args.only]
    print(f"config: {args.config}  seeds: {seeds}  libraries: {order}  phases: {', '.join(PHASES)}", flush=True)
    ratios: dict[int, dict[str, float | None]] = {}
    with tempfile.TemporaryDirectory(prefix="trl_compare_") as tmp:
        for seed in seeds:
            work = Path(tmp) / f"seed{seed}"
            overrides = [f"--loop.seed={seed}", *common]
            print(f"\n=== seed {seed}: {' '.join(overrides)}", flush=True)
            base = spawn("base", args, overrides, work)["base"]
            own = {"rlvr": [f"--loop.max_steps={args.rlvr_steps}"] if args.rlvr_steps else []}
            results = {name: spawn(name, args, overrides + own.get(name, []), work, base) for name in order}
            hashes = {r["heldout_hash"] for r in results.values()}
            if len(hashes) > 1:
                raise SystemExit(f"seed {seed}: the libraries evaluated different held-out splits {hashes}")
            print(f"\n--- seed {seed} (torch {results[order[0]]['versions']['torch']}, transformers "
                  f"{results[order[0]]['versions']['transformers']}"
                  + (f", trl {results['trl']['trl']})" if "trl" in results else ")"))
            for name in LIBRARIES:
                if name in results:
                    describe(name, results[name])
            if len(results) == 2:
                ratios[seed] = compare(results["rlvr"], results["trl"])
                print(f"peak RSS: rlvr {results['rlvr']['peak_rss_mb']:.0f} MiB, "
                      f"TRL {results['trl']['peak_rss_mb']:.0f} MiB")
    if ratios:
        summarize(ratios)


if __name__ == "__main__":
    main()
