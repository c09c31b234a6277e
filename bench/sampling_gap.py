"""Where a run's sampling time goes: the loop's wait for samples against ``sample_batch`` alone.

Runs a config as ``rlvr train`` does (``make_loop``, its defaults, held-out every
``--heldout-every`` steps) for ``--steps`` steps in this process, with every ``sample_batch`` call
the in-process engines make recorded: which engine (rollouts or held-out), its rows, the decode
steps it ran, its start and end. Afterwards each rollout call is replayed alone on the same model,
the same prompts, seeds and knobs, running the same number of decode steps (no end token), so the
replay does the same forward passes with nothing else running. Printed, over the steps after the
first (which warms caches):

- ``wait``: the loop's wait for each step's samples (``perf/sample_wait_time``); sampling starts
  when the last step's weights are published, so part of it may run before the loop waits (during
  held-out and checkpointing);
- ``in generate``: the time inside the rollout ``sample_batch`` calls that made the step's batch
  (those ending between the last step's hand-over and this one's), and how many calls;
- ``alone``: the same calls replayed alone; ``in generate / alone`` is what running inside a run
  costs generation itself (threads competing for the cores: rewards, the trainer's thread, the
  stream's loop); ``cpu in run`` and ``cpu alone``: the generating thread's CPU time in both (with
  one torch thread, the work itself: equal CPU times and unequal wall times mean waiting, not work);
- ``held-out in window``: held-out generation in the same window, and ``gate wait``: how long the
  rollout engine waited for the device meanwhile (the record's ``perf/gen/rlvr-engine/wait_s``).

    python bench/sampling_gap.py [--config examples/addition.toml] [--steps 6] [--threads N] [-- --sft.steps=0]
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import torch

from rlvr.backends.sample import engine as engine_module
from rlvr.backends.sample.batched import sample_batch
from rlvr.config.run import load_run_config
from rlvr.wiring.seams import make_loop


@dataclasses.dataclass
class Call:
    engine: str  # the worker thread's name: rlvr-engine (rollouts) or rlvr-heldout
    start: float
    end: float
    model: Any
    prompts: list
    params: Any
    seeds: list
    share_prompts: bool
    decode_steps: int
    cpu_s: float  # the calling thread's CPU time (torch computes on it with one thread)


class Recorder:
    """``sample_batch`` as the engines call it, every call recorded."""

    def __init__(self):
        self.calls: list[Call] = []
        self.step_ends: list[float] = []

    def __call__(self, model, prompts, params, *, seed, eos_ids, pad_id, share_prompts=False, compiled=False):
        start, cpu = time.perf_counter(), time.thread_time()
        outs = sample_batch(model, prompts, params, seed=seed, eos_ids=eos_ids, pad_id=pad_id,
                            share_prompts=share_prompts, compiled=compiled)
        self.calls.append(Call(threading.current_thread().name, start, time.perf_counter(), model, list(prompts),
                               params, list(seed), share_prompts, max(len(o.ids) for o in outs),
                               time.thread_time() - cpu))
        return outs


class StepMarks:
    """The run's trainer, noting when each step's samples were handed to it."""

    def __init__(self, inner: Any, marks: list[float]):
        self.inner, self.marks = inner, marks

    def __call__(self, batch: Any) -> Any:
        self.marks.append(time.perf_counter())
        return self.inner(batch)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def replay(call: Call, pad_id: int) -> tuple[float, float]:
    """Wall and thread CPU seconds of ``call`` run again alone."""
    params = dataclasses.replace(call.params, max_tokens=call.decode_steps)
    start, cpu = time.perf_counter(), time.thread_time()
    sample_batch(call.model, call.prompts, params, seed=call.seeds, eos_ids=set(), pad_id=pad_id,
                 share_prompts=call.share_prompts)
    return time.perf_counter() - start, time.thread_time() - cpu


def overlap(call: Call, lo: float, hi: float) -> float:
    return max(0.0, min(call.end, hi) - max(call.start, lo))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default=str(Path(__file__).resolve().parent.parent / "examples" / "addition.toml"))
    ap.add_argument("--steps", type=int, default=6, help="measured steps (one more runs first, as warm-up)")
    ap.add_argument("--heldout-every", type=int, default=2)
    ap.add_argument("--threads", type=int, help="torch threads (default: the config's model.threads)")
    ap.add_argument("overrides", nargs="*", help="config overrides, e.g. --sft.steps=0 (after --)")
    args = ap.parse_args()
    n = args.steps + 1
    overrides = [f"--loop.max_steps={n}", f"--loop.heldout_every={args.heldout_every}"]
    threads = [f"--model.threads={args.threads}"] if args.threads else []
    cfg = load_run_config(args.config, overrides + threads + list(args.overrides))
    recorder = Recorder()
    engine_module.sample_batch = recorder
    with tempfile.TemporaryDirectory(prefix="sampling_gap_") as tmp:
        loop = make_loop(cfg, Path(tmp) / "run", log=lambda m: print("  " + m, flush=True))
        pad = loop.trainer.policy.tokenizer.pad_token_id
        loop.trainer = StepMarks(loop.trainer, recorder.step_ends)
        record = loop.run()
    rows = []
    gate_waits = [m.get("perf/gen/rlvr-engine/wait_s", 0.0) for m in record.metrics]
    for step, (metrics, end) in enumerate(zip(record.metrics, recorder.step_ends, strict=True)):
        lo = recorder.step_ends[step - 1] if step else 0.0  # the step's batch was sampled after the last one's
        mine = [c for c in recorder.calls if c.engine == "rlvr-engine" and lo < c.end <= end]
        if step == 0:
            continue
        inside = sum(c.end - c.start for c in mine)
        held = sum(overlap(c, lo, end) for c in recorder.calls if c.engine == "rlvr-heldout")
        again = [replay(c, pad) for c in mine]
        rows.append({"wait": metrics["perf/sample_wait_time"], "in generate": inside, "calls": len(mine),
                     "alone": sum(a[0] for a in again), "cpu in run": sum(c.cpu_s for c in mine),
                     "cpu alone": sum(a[1] for a in again), "held-out in window": held,
                     "gate wait": gate_waits[step] - gate_waits[step - 1]})
    last = record.metrics[-1]
    print(f"{Path(args.config).name}: {args.steps} measured steps, {torch.get_num_threads()} torch threads; "
          f"rows per rollout call: {sorted({len(c.prompts) for c in recorder.calls if c.engine == 'rlvr-engine'})}")
    print(f"{'step':>4} " + " ".join(f"{k:>17}" for k in rows[0]))
    for i, row in enumerate(rows, start=2):
        print(f"{i:>4} " + " ".join(f"{v:>17.3f}" if isinstance(v, float) else f"{v:>17}" for v in row.values()))
    med = {k: statistics.median(r[k] for r in rows) for k in rows[0]}
    print("median " + " ".join(f"{k} {v:.3f}" for k, v in med.items()))
    total = {k: sum(r[k] for r in rows) for k in ("wait", "in generate", "alone", "cpu in run", "cpu alone")}
    print(f"in generate / alone {total['in generate'] / total['alone']:.3f}; wait / alone "
          f"{total['wait'] / total['alone']:.3f}; CPU time in run / alone "
          f"{total['cpu in run'] / total['cpu alone']:.3f}")
    gate = {k.removeprefix("perf/gen/"): round(v, 3) for k, v in last.items() if k.startswith("perf/gen/")}
    print(f"device gate over the run: {gate}")


if __name__ == "__main__":
    main()
