"""``EpisodeSlots`` (``task.agent_concurrency``): never more than its size inside, across event loops
and threads; a waiter cancelled before or as its turn comes leaks no slot."""

from __future__ import annotations

import asyncio
import threading

import pytest

from rlvr.rollouts.agents import EpisodeSlots


class Count:
    def __init__(self):
        self.lock, self.inside, self.most, self.done = threading.Lock(), 0, 0, 0

    async def visit(self, slots, hold_s=0.01):
        async with slots.turn():
            with self.lock:
                self.inside += 1
                self.most = max(self.most, self.inside)
            await asyncio.sleep(hold_s)
            with self.lock:
                self.inside -= 1
                self.done += 1


def test_never_more_than_its_size_inside_across_loops_and_threads():
    slots, count = EpisodeSlots(3), Count()

    def loop_of_visits():
        async def many():
            await asyncio.gather(*(count.visit(slots) for _ in range(20)))
        asyncio.run(many())

    threads = [threading.Thread(target=loop_of_visits) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert count.done == 80 and count.most == 3 and slots.busy == 0


def test_cancelled_waiters_leak_no_slot():
    slots, count = EpisodeSlots(1), Count()

    async def scenario():
        holder = asyncio.ensure_future(count.visit(slots, hold_s=0.05))
        await asyncio.sleep(0)  # the holder takes the one slot
        waiters = [asyncio.ensure_future(count.visit(slots)) for _ in range(5)]
        await asyncio.sleep(0.01)
        for w in waiters[:3]:  # cancelled while queued
            w.cancel()
        await holder
        waiters[3].cancel()  # its turn may be on its way: the slot must pass on either way
        await asyncio.gather(*waiters, return_exceptions=True)
        await asyncio.wait_for(count.visit(slots), 5)  # a slot is still there to take

    asyncio.run(scenario())
    assert slots.busy == 0 and count.most == 1


@pytest.mark.parametrize("size", [0, -1, 1.5, True])
def test_a_size_below_one_is_refused(size):
    with pytest.raises(ValueError, match="size must be an integer >= 1"):
        EpisodeSlots(size)
