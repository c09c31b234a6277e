"""Scaling out: throughput with 1, 2 and 4 inference servers and 1, 2 and 4 reward workers, against
the ideal (linear in their number), in one run, with sleeping seams.

Servers (``servers_and_workers``): the real :class:`~rlvr.backends.sample.pool.ServerPool` over N
fake servers, each answering one request at a time after sleeping S seconds (a server at its
capacity); ``ROWS`` rows of ``GROUP_K`` samples go through at once, as the rollout stream sends them.
Ideal: N / S rows per second. Reward workers: the real :class:`~rlvr.envs.workers.RewardWorkers`
(N worker processes) running a reward that sleeps R seconds per sample, called from as many threads
as the stream's event loop has. Ideal: N / R samples per second. Each ratio is measured / ideal;
the target is at least 0.9. Sleeping seams use no cores, so 2 cores do not limit these figures;
what they limit is real work: N `rlvr serve` processes or N rewards that compute share the same 2
cores, so on this machine real throughput stops growing at 2.

Each part is one function returning printable lines; ``main()`` runs every part in ``PARTS``.

    python bench/scaling.py
"""

from __future__ import annotations

import asyncio
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

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


PARTS: list[Callable[[], list[str]]] = [servers_and_workers]


def main() -> None:
    for part in PARTS:
        print(f"== {part.__name__}")
        for line in part():
            print(line)


if __name__ == "__main__":
    main()
