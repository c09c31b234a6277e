"""A verifiers 0.4 ``v1`` taskset: sums of two numbers of exactly ``digits`` digits (one digit: 0-9),
scored by a ``@reward`` on the final reply.

Its rows are exactly those of rlvr's own ``addition`` task with the same ``seed`` and ``digits`` (the
same draw, re-done here because the hubs' Python has no rlvr), so a run on this taskset has a twin
on ``task.name = "addition"``: the same rows, split and warm start, only the episode's path differs."""

from __future__ import annotations

import hashlib
import random
from collections.abc import Iterator

import verifiers.v1 as vf
from verifiers.v1.utils.decorators import reward

__all__ = ["SumsTaskset"]


class SumData(vf.TaskData):
    answer: str


class SumTask(vf.Task[SumData]):
    @reward(weight=1.0)
    async def correct(self, trace: vf.Trace) -> float:
        replies = [m for m in trace.messages if getattr(m, "role", None) == "assistant"]
        text = str(getattr(replies[-1], "content", "") or "") if replies else ""
        return float(text.strip() == self.data.answer)


class SumsConfig(vf.TasksetConfig):
    n: int = 100
    seed: int = 0
    digits: int = 1


def row_rng(seed: int, index: int) -> random.Random:
    """rlvr.seeding.rng_for(seed, "arithmetic", index): the generator rlvr's ``addition`` row ``index`` draws from."""
    text = "\x1f".join([str(seed), repr("arithmetic"), repr(index)])
    return random.Random(int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big") >> 1)


class SumsTaskset(vf.Taskset[SumTask, SumsConfig]):
    def load(self) -> Iterator[SumTask]:
        digits = self.config.digits
        low, high = (0 if digits == 1 else 10 ** (digits - 1)), 10**digits - 1
        for i in range(self.config.n):
            rng = row_rng(self.config.seed, i)
            a, b = rng.randint(low, high), rng.randint(low, high)
            yield SumTask(SumData(prompt=f"{a}+{b}=", answer=str(a + b)), self.config.task)
