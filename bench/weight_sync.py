"""Per-step cost of each weight-sync lane, as a fraction of one RL step, on the demo model.

The step-time baseline is measured in the same run: one in-process sampling round (``tasks x k``
prompts of the demo task through :class:`~rlvr.backends.sample.batched.TransformersSampler`) plus one
:class:`~rlvr.backends.train.trainer.TorchTrainer` step, for the full fine-tune (the demo's default) or
LoRA. Each lane publishes several versions, one such step before each publish, to ``rlvr serve``
running as a child process (the HTTP lanes) or to an in-process engine; the median publish time
is divided by the median of the steps timed alongside it. Targets: hot LoRA load <= 5% of a step;
kill-and-restart is there for contrast.

    python bench/weight_sync.py [--tasks 32] [--k 8] [--reps 5] [--threads 2]
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import statistics
import tempfile
import time
from pathlib import Path

import torch

from rlvr.algos.advantages import ADVANTAGES
from rlvr.backends.model.policy import LoraSpec, Policy
from rlvr.backends.model.tiny import build_tiny_model
from rlvr.backends.sample.batched import TransformersSampler
from rlvr.backends.sample.engine import InProcessEngine
from rlvr.backends.sample.http import HTTPGenerator
from rlvr.backends.serve.process import ServerProcess
from rlvr.backends.sync.in_process import InProcessLane
from rlvr.backends.sync.lanes import DiskReloadLane, KillRestartLane, LoraHotLoadLane
from rlvr.backends.train.trainer import TorchTrainer
from rlvr.data.tasks import load_tasks
from rlvr.envs.tasks.arithmetic import make_rows, reward_fn
from rlvr.types import Batch, Group, SamplingParams

DEMO = {"hidden": 128, "layers": 4, "heads": 4}  # examples/addition.toml [model]
MAX_NEW_TOKENS = 6  # examples/addition.toml [sampler]


class Rig:
    """A policy, its sampler and trainer, and the demo tasks."""

    def __init__(self, base: Path, lora_rank: int, tasks: list, k: int):
        lora = LoraSpec(rank=lora_rank, alpha=32.0) if lora_rank else None
        self.policy = Policy(str(base), lora=lora, need_reference=False)
        self.sampler = TransformersSampler(self.policy, max_new_tokens=MAX_NEW_TOKENS, temperature=1.0)
        self.trainer = TorchTrainer(self.policy, lr=1e-3 if lora_rank else 1e-4)
        self.tasks, self.k, self.steps = tasks, k, 0

    def step(self) -> float:
        """One sampling round + one train step; its wall time."""
        start = time.perf_counter()
        self.steps += 1
        groups = []
        for task, rollouts in zip(self.tasks, self.sampler(self.tasks, self.k), strict=True):
            scored = [dataclasses.replace(r, reward=reward_fn(list(r.messages), task.answer)) for r in rollouts]
            groups.append(Group(task, tuple(scored), tuple(ADVANTAGES["grpo"]([r.reward for r in scored]))))
        self.trainer(Batch(self.steps, tuple(groups)))
        return time.perf_counter() - start


def time_lane(rig: Rig, lane, reps: int) -> tuple[list[float], list[float]]:
    """Publish ``reps + 1`` versions, a step before each (the first pair is a warm-up). Returns the
    publish times and the step times: each lane is compared with steps timed in the same window,
    so a machine whose load drifts during the run does not skew the ratios."""
    publish, steps = [], []
    for i in range(reps + 1):
        step_s = rig.step()
        start = time.perf_counter()
        served = lane(rig.policy.version)
        elapsed = time.perf_counter() - start
        assert served == rig.policy.version, (served, rig.policy.version)
        if i:
            publish.append(elapsed)
            steps.append(step_s)
    return publish, steps


def probe(url: str, model: str, version: int) -> None:
    """One completion from the published model, checking the version it reports."""
    out = asyncio.run(HTTPGenerator(url, model).generate([1, 5, 6], SamplingParams(max_tokens=2), seed=0))
    assert out.version == version, (out.version, version)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tasks", type=int, default=32)
    ap.add_argument("--k", type=int, default=8)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--restart-reps", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--lora-rank", type=int, default=16)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    tasks = load_tasks(make_rows(args.tasks, seed=0))
    rows: list[tuple[str, str, tuple[list[float], list[float]]]] = []
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        base = build_tiny_model(tmp / "base", **DEMO, seed=0)
        full = Rig(base, 0, tasks, args.k)
        lora = Rig(base, args.lora_rank, tasks, args.k)
        rows.append(("in-process, live model", "full", time_lane(full, InProcessLane(), args.reps)))
        engine = InProcessEngine.replica_of(full.policy)
        try:
            rows.append(("in-process, replica engine", "full",
                         time_lane(full, InProcessLane(engine, full.policy), args.reps)))
        finally:
            engine.close()

        with ServerProcess(base, served_model_name="base", threads=1) as server:
            hot = LoraHotLoadLane(lora.policy, server.url, tmp / "lora-sync", keep=2)
            rows.append(("HTTP, LoRA hot-load", "lora", time_lane(lora, hot, args.reps)))
            probe(server.url, hot.name_of(lora.policy.version), lora.policy.version)
            disk = DiskReloadLane(full.policy, server.url, tmp / "disk-sync")
            rows.append(("HTTP, disk reload", "full", time_lane(full, disk, args.reps)))
            probe(server.url, "base", full.policy.version)

        for name, rig in (("full", full), ("lora", lora)):
            lane = KillRestartLane(rig.policy, tmp / f"restart-{name}", base_model_dir=base, threads=1)
            try:
                lane(rig.policy.version)  # the first start is not a restart
                rows.append((f"HTTP, kill-and-restart ({name})", name, time_lane(rig, lane, args.restart_reps)))
                probe(lane.url, "policy", rig.policy.version)
            finally:
                lane.close()

    n_params = sum(p.numel() for p in full.policy.model.parameters())
    n_lora = sum(p.numel() for p in lora.policy.trainable_parameters())
    print(f"demo model: hidden {DEMO['hidden']}, layers {DEMO['layers']}, {n_params / 1e6:.2f}M parameters; "
          f"LoRA rank {args.lora_rank}: {n_lora / 1e3:.0f}K trainable; threads {args.threads}")
    print(f"step = sample {args.tasks}x{args.k} ({MAX_NEW_TOKENS} new tokens) + 1 train step, timed in each "
          f"lane's window; {args.reps} publishes per lane ({args.restart_reps} for kill-and-restart) after a warm-up")
    print(f"{'lane':32} {'policy':6} {'publish ms':>10} {'max ms':>9} {'step ms':>9} {'/ step':>8}")
    for lane_name, policy, (publish, steps) in rows:
        median, step_s = statistics.median(publish), statistics.median(steps)
        print(f"{lane_name:32} {policy:6} {median * 1000:10.1f} {max(publish) * 1000:9.1f} {step_s * 1000:9.1f} "
              f"{median / step_s:8.3f}")
    publish, steps = next(r[2] for r in rows if r[0] == "HTTP, LoRA hot-load")
    ratio = statistics.median(publish) / statistics.median(steps)
    print(f"hot LoRA load: {ratio:.1%} of a step (target <= 5%): {'met' if ratio <= 0.05 else 'NOT met'}")


if __name__ == "__main__":
    main()
