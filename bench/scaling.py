"""Scale-out: what more processes buy, one part per layout, all in one run.

Servers (``servers_and_workers``): the real :class:`~rlvr.backends.sample.pool.ServerPool` over N
fake servers, each answering one request at a time after sleeping S seconds (a server at its
capacity); ``ROWS`` rows of ``GROUP_K`` samples go through at once, as the rollout stream sends them.
Ideal: N / S rows per second. Reward workers: the real :class:`~rlvr.envs.workers.RewardWorkers`
(N worker processes) running a reward that sleeps R seconds per sample, called from as many threads
as the stream's event loop has. Ideal: N / R samples per second. Each ratio is measured / ideal;
the target is at least 0.9. Sleeping seams use no cores, so 2 cores do not limit these figures;
what they limit is real work: N `rlvr serve` processes or N rewards that compute share the same 2
cores, so on this machine real throughput stops growing at 2.

``trainer_ranks()``: the data-parallel trainer's step time on 2 gloo ranks against 1 process, on the
demo's shapes (examples/addition.toml: the tiny model at hidden 128, 4 layers, 4 heads, full
fine-tune; 32 rows x 8 completions of up to 6 tokens, on the demo's real prompts). Both sides run
the same batches through the same trainer code; 1 process uses every core, each of the 2 ranks
gets half of them (as ``rlvr train --nproc 2`` does); 1 process is also timed on half the cores, a
rank's share. Prints the median step time of each and the ratios (2 ranks / 1 process: below 1
means the ranks help). On a loaded machine torch's intra-op threads wait on each other, so the
single process on all cores can be far slower than on one: compare against both. On a 2-core
machine the two ranks share the cores one process already used, so the ratio measures the
all-reduce and broadcast overhead more than any speed-up; the gain needs a core (or GPU) per rank.
The same 2 ranks sharded with FSDP2 (``[train] shard = "fsdp"``) are timed too, beside the
replicated ones: sharding adds an all-gather per layer in every forward and backward and a
reduce-scatter per layer, so on a model this small it costs time; it is there to fit a policy that
one device cannot hold.

Each part is one function returning printable lines; ``main()`` runs every part in ``PARTS``.

    python bench/scaling.py [--steps 5]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import socket
import statistics
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch

from rlvr.backends.sample.pool import ServerPool
from rlvr.envs.workers import RewardWorkers
from rlvr.types import Completion, SamplingParams, StopReason

S, R = 0.05, 0.1  # seconds: one request on a server, one reward call
ROWS, GROUP_K, REWARD_CALLS = 64, 4, 48
COUNTS = (1, 2, 4)
SLEEPING_REWARD = "import time\n\ndef reward_fn(messages, answer):\n    time.sleep({R})\n    return 1.0\n"


class SleepingServer:
    """Answers one request at a time (a group's samples in one request), each after S seconds."""

    def __init__(self, url: str):
        self.url, self.busy, self.pending = url, asyncio.Lock(), {}

    async def generate(self, prompt_ids, params, *, seed, session_id=None) -> Completion:
        key = tuple(prompt_ids)
        if key not in self.pending:  # the first sample of a group sends the request
            self.pending[key] = asyncio.ensure_future(self._request())
        await asyncio.shield(self.pending[key])
        return Completion((1,), (-0.1,), StopReason.STOP, None)

    async def _request(self) -> None:
        async with self.busy:
            await asyncio.sleep(S)


def rows_per_second(servers: int) -> float:
    pool = ServerPool([SleepingServer(f"fake://{i}") for i in range(servers)], per_server=1, log=lambda _m: None)
    params = SamplingParams(max_tokens=4)

    async def run() -> float:
        start = time.perf_counter()
        await asyncio.gather(*(pool.generate([row, 1], params, seed=i) for row in range(ROWS)
                               for i in range(GROUP_K)))
        return ROWS / (time.perf_counter() - start)

    return asyncio.run(run())


def rewards_per_second(workers: int, folder: Path) -> float:
    env = folder / "sleeping_reward.py"
    env.write_text(SLEEPING_REWARD.replace("{R}", repr(R)))
    pool = RewardWorkers(("rlvr.envs.workers:load_env", {"env": str(env)}), workers=workers, timeout_s=30)
    messages = [{"role": "user", "content": "1+1"}, {"role": "assistant", "content": "2"}]
    try:
        with ThreadPoolExecutor(max(COUNTS)) as threads:  # the stream runs rewards from its threads
            start = time.perf_counter()
            list(threads.map(lambda _i: pool(messages, "2", None), range(REWARD_CALLS)))
            return REWARD_CALLS / (time.perf_counter() - start)
    finally:
        pool.close()


def servers_and_workers() -> list[str]:
    lines = [f"servers (S = {S}s per request, {ROWS} rows x {GROUP_K} samples, 1 request in flight per server):"]
    for n in COUNTS:
        got, ideal = rows_per_second(n), n / S
        lines.append(f"  {n} server(s): {got:7.1f} rows/s, ideal {ideal:6.1f}, ratio {got / ideal:.3f}")
    lines.append(f"reward workers (R = {R}s per sample, {REWARD_CALLS} calls):")
    with tempfile.TemporaryDirectory() as folder:
        for n in COUNTS:
            got, ideal = rewards_per_second(n, Path(folder)), n / R
            lines.append(f"  {n} worker(s): {got:7.1f} samples/s, ideal {ideal:6.1f}, ratio {got / ideal:.3f}")
    return lines


DEMO = {"hidden": 128, "layers": 4, "heads": 4}  # examples/addition.toml [model]
ROWS_TRAIN, GROUP_K_TRAIN, MAX_NEW_TOKENS = 32, 8, 6  # [loop] tasks_per_step, group_k; [sampler] max_new_tokens
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
    tasks = load_tasks(procedural_task("addition")[0](ROWS_TRAIN * steps, seed=0, digits=2))
    rng = random.Random(0)
    batches = []
    for step in range(steps):
        rollouts = []
        for task in tasks[step * ROWS_TRAIN:(step + 1) * ROWS_TRAIN]:
            prompt = tuple(prompt_ids_of(task, tokenizer))
            for _ in range(GROUP_K_TRAIN):
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


def _rank(rank: int, world: int, port: int, base: Path, batches: list[Any], out: Path, shard: str) -> None:
    from rlvr.backends.train.distributed import DistributedTrainer, Ranks, RankTrainer, serve_rank, start_ranks
    from rlvr.backends.train.sharded import ShardedTrainer

    cls = ShardedTrainer if shard == "fsdp" else RankTrainer
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    ranks = start_ranks(Ranks(rank, world, rank, ""), "cpu")  # cores // world threads each
    if rank == 0:
        trainer = DistributedTrainer(_trainer(base, cls), ranks)
        (out / f"times-{shard}.txt").write_text(" ".join(map(str, _timed(trainer, batches))))
        trainer.close()
    else:
        serve_rank(lambda _: _trainer(base, cls))
    torch.distributed.destroy_process_group()


def _two_ranks(base: Path, batches: list[Any], out: Path, shard: str) -> float:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    torch.multiprocessing.spawn(_rank, args=(2, port, base, batches, out, shard), nprocs=2)
    return statistics.median(float(t) for t in (out / f"times-{shard}.txt").read_text().split())


def trainer_ranks(steps: int = 5) -> dict[str, float]:
    """Median train-step seconds on 1 process (all cores) and 2 gloo ranks (half each), replicated and
    FSDP2-sharded, and the ratios."""
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
        two = _two_ranks(base, batches, Path(tmp), "replicate")
        fsdp = _two_ranks(base, batches, Path(tmp), "fsdp")
    all_cores, half = one[_cores()], one[max(1, _cores() // 2)]
    return {"one_process_s": all_cores, "one_process_half_cores_s": half, "two_ranks_s": two,
            "ratio": two / all_cores, "ratio_same_threads": two / half, "cores": float(_cores()),
            "two_fsdp_ranks_s": fsdp, "fsdp_ratio": fsdp / all_cores, "fsdp_vs_replicate": fsdp / two}


def trainer_ranks_part(steps: int = 5) -> list[str]:
    r = trainer_ranks(steps)
    return [f"trainer ranks (demo shapes, {ROWS_TRAIN}x{GROUP_K_TRAIN} rollouts, full fine-tune, "
            f"{r['cores']:.0f} cores): "
            f"1 process {r['one_process_s']:.3f} s/step on all cores, {r['one_process_half_cores_s']:.3f} s/step on "
            f"half; 2 gloo ranks {r['two_ranks_s']:.3f} s/step (half the cores each); ratio {r['ratio']:.2f} "
            f"(2 ranks / 1 process on all cores), {r['ratio_same_threads']:.2f} (against 1 process on a rank's "
            "threads)",
            f"  2 FSDP2-sharded gloo ranks {r['two_fsdp_ranks_s']:.3f} s/step; ratio {r['fsdp_ratio']:.2f} (2 sharded "
            f"ranks / 1 process on all cores), {r['fsdp_vs_replicate']:.2f} (sharded / replicated ranks)"]


PARTS: list[Callable[..., list[str]]] = [servers_and_workers, trainer_ranks_part]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=5, help="timed train steps per side (after one warm-up)")
    args = ap.parse_args()
    for part in PARTS:
        print(f"== {part.__name__}")
        for line in (part(args.steps) if part is trainer_ranks_part else part()):
            print(line)


if __name__ == "__main__":
    main()
