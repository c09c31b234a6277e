"""Async overlap: the loop's per-step wall time when sampling takes S seconds and training T.

Part 1 runs the real loop (admission control, stream, record) over fake seams that sleep: every
sample sleeps S (samples of a batch run concurrently, so a batch takes about S) and every train
step sleeps T, and at most one batch of rows samples at once (a sampler of finite capacity). For a
grid of S/T and modes it prints the median step time, its ratio to max(S, T)
(the best any overlap can do) and the speed-up over synchronous training (which needs S + T).
Targets at O = 1 and S = T: within 10% of max(S, T) and at least 1.8x faster than synchronous.

Part 2 (``--demo``) runs the CPU demo (examples/addition.toml) synchronously and at O = 1 in the
same process, one after the other, and prints each one's median step time, mean overlap ratio and
held-out gain. On a 2-core machine the sampler and trainer share the cores, so expect less.

    python bench/async_overlap.py [--steps 12] [--demo] [--demo-steps 200] [--threads 2]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from rlvr import GRPOConfig, RLLoop
from rlvr.testing import FakeRolloutFn, FakeTrainer, ScriptedEvaluator, exact_match, make_rows

MODES: dict[str, dict[str, Any]] = {
    "sync": {"synchronous_training": True},
    "O=0": {"max_head_offpolicy_versions": 0},
    "O=1": {"max_head_offpolicy_versions": 1},
    "O=2": {"max_head_offpolicy_versions": 2},
}
GRID = [(0.10, 0.10), (0.20, 0.10), (0.10, 0.20), (0.05, 0.20), (0.20, 0.05)]


class SleepingTrainer(FakeTrainer):
    def __init__(self, seconds: float):
        super().__init__()
        self.seconds = seconds

    def __call__(self, batch):
        time.sleep(self.seconds)
        return super().__call__(batch)


def sleeping_rollouts(seconds: float, trainer: FakeTrainer):
    inner = FakeRolloutFn(0.5, policy=trainer)

    async def rollout(row):
        await asyncio.sleep(seconds)
        return await inner(row)

    return rollout


def fake_step_time(S: float, T: float, mode: dict[str, Any], steps: int) -> float:
    # One batch in flight at most: a sampler with the capacity of one batch, as a real server has
    # a finite throughput (sleeping seams alone would sample any number of batches at once).
    cfg = GRPOConfig(tasks_per_step=8, group_k=4, max_steps=steps, heldout_every=steps, corpus_min=20,
                     max_rows_in_flight=8, **mode)
    trainer = SleepingTrainer(T)
    loop = RLLoop.from_reward(cfg, exact_match, make_rows(200), rollout_fn=sleeping_rollouts(S, trainer),
                              trainer=trainer, heldout_eval=ScriptedEvaluator(lambda s: 0.0))
    record = loop.run()
    return statistics.median(m["perf/step_time"] for m in record.metrics[2:])  # past the pipeline fill


def part_one(steps: int) -> None:
    print(f"Part 1: fake seams, {steps} steps each, median step time past the first two steps")
    print(f"{'S':>5} {'T':>5} {'mode':>5} {'step s':>8} {'/max(S,T)':>10} {'x vs sync':>10}")
    for S, T in GRID:
        sync = None
        for name, mode in MODES.items():
            step = fake_step_time(S, T, mode, steps)
            sync = step if sync is None else sync
            print(f"{S:5.2f} {T:5.2f} {name:>5} {step:8.3f} {step / max(S, T):10.3f} {sync / step:10.2f}")


def demo_run(mode: dict[str, Any], steps: int, threads: int) -> dict[str, float]:
    from rlvr.config.run import load_run_config
    from rlvr.wiring.seams import make_loop

    config = Path(__file__).resolve().parent.parent / "examples" / "addition.toml"
    overrides = [f"--loop.max_steps={steps}", f"--model.threads={threads}"]
    overrides += [f"--loop.{k}={str(v).lower()}" for k, v in mode.items()]
    cfg = load_run_config(config, overrides)
    with tempfile.TemporaryDirectory() as tmp:
        loop = make_loop(cfg, Path(tmp) / "run", log=lambda _m: None)
        t0 = time.monotonic()
        record = loop.run()
        wall = time.monotonic() - t0
    summary = record.finished.data["summary"]
    metrics = record.metrics[1:]
    return {"step": statistics.median(m["perf/step_time"] for m in metrics),
            "overlap": statistics.mean(m["perf/overlap_ratio"] for m in metrics),
            "wait": statistics.mean(m["perf/wait_time_ratio"] for m in metrics),
            "base": summary["baseline_heldout_score"], "best": summary["selected_heldout_score"],
            "gain": summary["heldout_gain"], "wall": wall}


def part_two(steps: int, threads: int) -> None:
    print(f"\nPart 2: the CPU demo, {steps} steps, {threads} torch threads, same process")
    print(f"{'mode':>5} {'step ms':>8} {'overlap':>8} {'wait':>6} {'held-out':>16} {'gain':>7} {'wall s':>7}")
    results = {}
    for name in ("sync", "O=1"):
        r = results[name] = demo_run(MODES[name], steps, threads)
        print(f"{name:>5} {r['step'] * 1000:8.1f} {r['overlap']:8.2f} {r['wait']:6.2f} "
              f"{r['base']:.3f} -> {r['best']:.3f} {r['gain'] * 100:+6.1f} {r['wall']:7.1f}")
    print(f"O=1 step time / sync step time: {results['O=1']['step'] / results['sync']['step']:.3f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--demo", action="store_true", help="also run the CPU demo sync vs O=1")
    ap.add_argument("--demo-steps", type=int, default=200)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--skip-fake", action="store_true")
    args = ap.parse_args()
    if not args.skip_fake:
        part_one(args.steps)
    if args.demo:
        part_two(args.demo_steps, args.threads)


if __name__ == "__main__":
    main()
