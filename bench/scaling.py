"""Scale-out: what more processes buy, one part per layout, all in one run.

``trainer_ranks()``: the data-parallel trainer's step time on 2 gloo ranks against 1 process, on the
demo's shapes (examples/addition.toml: the tiny model at hidden 128, 4 layers, 4 heads, full
fine-tune; 32 rows x 8 completions of up to 6 tokens, on the demo's real prompts). Both sides run
the same batches through the same trainer code; 1 process uses every core, each of the 2 ranks
gets half of them (as ``rlvr train --nproc 2`` does); 1 process is also timed on half the cores, a
rank's share. Prints the median step time of each and the ratios (2 ranks / 1 process: below 1
means the ranks help). On a loaded machine torch's intra-op threads wait on each other, so the
single process on all cores can be far slower than on one: compare against both. On a 2-core machine the two ranks share
the cores one process already used, so the ratio measures the all-reduce and broadcast overhead
more than any speed-up; the gain needs a core (or GPU) per rank.

    python bench/scaling.py [--steps 5]
"""

from __future__ import annotations

import argparse
import os
import random
import socket
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

DEMO = {"hidden": 128, "layers": 4, "heads": 4}  # examples/addition.toml [model]
ROWS, GROUP_K, MAX_NEW_TOKENS = 32, 8, 6  # [loop] tasks_per_step, group_k; [sampler] max_new_tokens
LR = 1e-4


def _cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def demo_batches(base: Path, steps: int) -> list[Any]:
    """``steps`` batches of the demo's shape: real addition prompts, random completions."""
    from rlvr.backends.model.io import load_tokenizer
    from rlvr.backends.model.tokenizer import HFChatTokenizer
    from rlvr.data.tasks import load_tasks
    from rlvr.envs import procedural_task
    from rlvr.rollouts.episodes import prompt_ids_of
    from rlvr.testing import batch_of
    from rlvr.types import Rollout

    tokenizer = HFChatTokenizer(load_tokenizer(str(base)))
    tasks = load_tasks(procedural_task("addition")[0](ROWS * steps, seed=0, digits=2))
    rng = random.Random(0)
    batches = []
    for step in range(steps):
        rollouts = []
        for task in tasks[step * ROWS:(step + 1) * ROWS]:
            prompt = tuple(prompt_ids_of(task, tokenizer))
            for _ in range(GROUP_K):
                completion = tuple(rng.randrange(20, 90) for _ in range(rng.randint(2, MAX_NEW_TOKENS)))
                rollouts.append(Rollout(task_id=task.id, prompt_ids=prompt, completion_ids=completion,
                                        logprobs=(-2.0,) * len(completion), text="", messages=task.messages))
        batches.append(batch_of(rollouts, [rng.uniform(-1, 1) for _ in rollouts], step + 1))
    return batches


def _trainer(base: Path, cls: Any) -> Any:
    from rlvr.backends.model.policy import Policy

    return cls(Policy(str(base), lora=None, need_reference=False, seed=0), lr=LR)


def _timed(trainer: Any, batches: list[Any]) -> list[float]:
    times = []
    for batch in batches:
        t0 = time.perf_counter()
        trainer(batch)
        times.append(time.perf_counter() - t0)
    return times[1:]  # the first step warms caches and allocators


def _rank(rank: int, world: int, port: int, base: Path, batches: list[Any], out: Path) -> None:
    from rlvr.backends.train.distributed import DistributedTrainer, Ranks, RankTrainer, serve_rank, start_ranks

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    ranks = start_ranks(Ranks(rank, world, rank, ""), "cpu")  # cores // world threads each
    if rank == 0:
        trainer = DistributedTrainer(_trainer(base, RankTrainer), ranks)
        (out / "times.txt").write_text(" ".join(map(str, _timed(trainer, batches))))
        trainer.close()
    else:
        serve_rank(lambda _: _trainer(base, RankTrainer))
    torch.distributed.destroy_process_group()


def trainer_ranks(steps: int = 5) -> dict[str, float]:
    """Median train-step seconds on 1 process (all cores) and 2 gloo ranks (half each), and the ratio."""
    from rlvr.backends.model.tiny import build_tiny_model
    from rlvr.backends.train.trainer import TorchTrainer

    with tempfile.TemporaryDirectory() as tmp:
        base = build_tiny_model(Path(tmp) / "base", **DEMO, seed=0)
        batches = demo_batches(base, steps + 1)
        threads = torch.get_num_threads()
        one = {}
        for n in (_cores(), max(1, _cores() // 2)):
            torch.set_num_threads(n)
            one[n] = statistics.median(_timed(_trainer(base, TorchTrainer), batches))
        torch.set_num_threads(threads)
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        torch.multiprocessing.spawn(_rank, args=(2, port, base, batches, Path(tmp)), nprocs=2)
        two = statistics.median(float(t) for t in (Path(tmp) / "times.txt").read_text().split())
    all_cores, half = one[_cores()], one[max(1, _cores() // 2)]
    return {"one_process_s": all_cores, "one_process_half_cores_s": half, "two_ranks_s": two,
            "ratio": two / all_cores, "ratio_same_threads": two / half, "cores": float(_cores())}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=5, help="timed train steps per side (after one warm-up)")
    args = ap.parse_args()
    r = trainer_ranks(args.steps)
    print(f"trainer ranks (demo shapes, {ROWS}x{GROUP_K} rollouts, full fine-tune, {r['cores']:.0f} cores): "
          f"1 process {r['one_process_s']:.3f} s/step on all cores, {r['one_process_half_cores_s']:.3f} s/step on "
          f"half; 2 gloo ranks {r['two_ranks_s']:.3f} s/step (half the cores each); ratio {r['ratio']:.2f} "
          f"(2 ranks / 1 process on all cores), {r['ratio_same_threads']:.2f} (against 1 process on a rank's threads)")


if __name__ == "__main__":
    main()
