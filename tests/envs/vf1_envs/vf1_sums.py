"""A verifiers 0.4 ``v1`` taskset: one-digit sums, scored by a ``@reward`` on the final reply."""

from __future__ import annotations

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


class SumsTaskset(vf.Taskset[SumTask, SumsConfig]):
    def load(self) -> Iterator[SumTask]:
        for i in range(self.config.n):
            rng = random.Random(self.config.seed + i)
            a, b = rng.randint(0, 9), rng.randint(0, 9)
            yield SumTask(SumData(prompt=f"{a}+{b}=", answer=str(a + b)), self.config.task)
