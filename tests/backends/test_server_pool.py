"""The sampler pool over several servers and the lane that publishes to all of them, on fake servers."""

from __future__ import annotations

import asyncio

import pytest

from rlvr.backends.sample.pool import ServerPool
from rlvr.backends.sync.fanout import FanoutLane
from rlvr.errors import BackendError
from rlvr.types import Completion, SamplingParams, StopReason

PARAMS = SamplingParams(max_tokens=4, temperature=1.0)


class FakeServer:
    """A server's generator: sleeps ``delay`` per request, fails once ``dead`` says why."""

    def __init__(self, url: str, delay: float = 0.02):
        self.url, self.delay = url, delay
        self.dead: str | None = None
        self.active = self.peak = 0
        self.calls: list[tuple[tuple[int, ...], int]] = []

    def diagnose(self) -> str | None:
        return self.dead

    async def health(self, timeout_s: float | None = None) -> bool:
        return self.dead is None

    async def generate(self, prompt_ids, params, *, seed, session_id=None) -> Completion:
        self.active += 1
        self.peak = max(self.peak, self.active)
        try:
            await asyncio.sleep(self.delay)
            if self.dead is not None:
                raise BackendError(f"HTTP sampler: POST {self.url}/v1/completions failed after 4 attempt(s)")
            self.calls.append((tuple(prompt_ids), seed))
            return Completion((1, 2), (-0.5, -0.5), StopReason.STOP, None)
        finally:
            self.active -= 1


def _pool(n: int, per_server: int = 2, **kw) -> tuple[ServerPool, list[FakeServer], list[str]]:
    servers = [FakeServer(f"http://s{i}") for i in range(n)]
    lines: list[str] = []
    return ServerPool(servers, per_server=per_server, log=lines.append, **kw), servers, lines


async def _rows(pool: ServerPool, n_rows: int, k: int = 1) -> list[Completion]:
    calls = [pool.generate([row + 10, 5], PARAMS, seed=row * 100 + i) for row in range(n_rows) for i in range(k)]
    return list(await asyncio.gather(*calls))


def test_rows_are_spread_within_the_per_server_cap():
    pool, servers, _ = _pool(3, per_server=2)
    out = asyncio.run(_rows(pool, 18))
    assert len(out) == 18
    assert all(s.peak == 2 for s in servers)  # every server used, none beyond its cap
    assert sorted(len(s.calls) for s in servers) == [6, 6, 6]  # least-loaded in rotation: an even spread


def test_a_group_stays_on_one_server():
    pool, servers, _ = _pool(2, per_server=1)
    asyncio.run(_rows(pool, 4, k=3))
    for server in servers:
        prompts = [p for p, _ in server.calls]
        assert all(prompts.count(p) == 3 for p in set(prompts))  # a row's 3 samples, all here or none
    assert sum(len(s.calls) for s in servers) == 12


def test_in_flight_requests_of_a_dead_server_fail_over():
    pool, (a, b), lines = _pool(2, per_server=4)

    async def run() -> list[Completion]:
        calls = asyncio.gather(*(pool.generate([i + 10], PARAMS, seed=i) for i in range(8)))
        await asyncio.sleep(0.005)  # requests are in flight on both
        a.dead = "rlvr serve process at http://s0 (pid 1) was killed by signal 9"
        return await calls

    out = asyncio.run(run())
    assert len(out) == 8 and not a.calls and len(b.calls) == 8
    assert pool.failovers == 4
    assert [m.removed for m in pool.members] == [a.dead, None]
    (warning,) = pool.take_warnings()
    assert warning == {"warning": "server_removed", "server": "http://s0", "reason": a.dead, "servers_left": 1}
    assert pool.take_warnings() == []
    assert len(lines) == 1 and "http://s0 taken out of rotation" in lines[0] and "1 of 2 left" in lines[0]


def test_a_healthy_server_that_fails_a_request_is_an_error_not_a_removal():
    pool, (a, _b), _ = _pool(2, per_server=1)

    async def broken(*args, **kwargs):
        raise BackendError("HTTP sampler: returned 3 choices, expected 1")

    a.generate = broken
    with pytest.raises(BackendError, match="expected 1"):
        asyncio.run(_rows(pool, 1))
    assert pool.alive == pool.members


def test_no_server_left_stops_naming_each_and_why():
    pool, (a, b), _ = _pool(2)
    a.dead, b.dead = "exited with code 1", "was killed by signal 9"
    with pytest.raises(BackendError) as info:
        asyncio.run(_rows(pool, 2))
    message = str(info.value)
    assert "no inference server left" in message and "rlvr resume" in message
    assert "http://s0: exited with code 1" in message and "http://s1: was killed by signal 9" in message


class FakeLane:
    def __init__(self, server: FakeServer, stale: bool = False):
        self.server, self.stale, self.published = server, stale, []

    def __call__(self, version: int) -> int:
        if self.server.dead:
            raise BackendError(f"POST {self.server.url}/v1/load_lora_adapter failed: connection refused")
        self.published.append(version)
        return version - 1 if self.stale else version


def test_publish_goes_to_every_server_and_each_version_is_checked():
    pool, servers, _ = _pool(3)
    lanes = [FakeLane(s) for s in servers]
    fanout = FanoutLane(pool, lanes)
    assert fanout(1) == 1 and fanout(2) == 2
    assert [lane.published for lane in lanes] == [[1, 2]] * 3
    lanes[2].stale = True
    with pytest.raises(BackendError, match=r"http://s2 serves policy version 2 after publishing version 3"):
        fanout(3)


def test_a_server_dead_at_publish_leaves_the_rotation_and_none_left_stops():
    pool, (a, b), _ = _pool(2)
    lanes = [FakeLane(a), FakeLane(b)]
    fanout = FanoutLane(pool, lanes)
    a.dead = "exited with code -9"
    assert fanout(1) == 1
    assert lanes[0].published == [] and lanes[1].published == [1]
    assert [w["server"] for w in fanout.take_warnings()] == ["http://s0"]
    b.dead = "exited with code 1"
    with pytest.raises(BackendError, match="no inference server left"):
        fanout(2)


def test_a_healthy_server_refusing_a_publish_stops_the_run():
    pool, (a, _b), _ = _pool(2)

    class Refusing(FakeLane):
        def __call__(self, version: int) -> int:
            raise BackendError("refused with HTTP 400")

    fanout = FanoutLane(pool, [Refusing(a), FakeLane(_b)])
    fanout._why_dead = lambda generator, exc: None  # as for a server that answers /health
    with pytest.raises(BackendError, match="failed while the server is up"):
        fanout(1)
    assert pool.alive == pool.members


def test_a_session_stays_on_the_server_its_first_call_went_to():
    pool, servers, _ = _pool(2, per_server=1)

    async def episode(session: str, turns: int) -> None:
        for turn in range(turns):  # each turn a new, longer prompt: only the session ties them together
            await pool.generate([int(session[2:]) + 10, turn], PARAMS, seed=turn, session_id=session)

    async def run() -> None:
        await asyncio.gather(*(episode(f"ep{i}", 4) for i in range(6)))

    asyncio.run(run())
    pinned = {f"ep{i}": pool.server_of(f"ep{i}") for i in range(6)}
    assert set(pinned.values()) == {"http://s0", "http://s1"}  # sessions spread over both servers
    for server in servers:
        mine = {s for s, url in pinned.items() if url == server.url}
        assert len(server.calls) == 4 * len(mine)  # every call of its sessions, and no other
    pool.forget("ep0")
    assert pool.server_of("ep0") is None


def test_a_pinned_server_that_leaves_hands_its_session_on():
    pool, (a, b), _ = _pool(2, per_server=2)
    asyncio.run(pool.generate([10], PARAMS, seed=0, session_id="ep"))
    first = pool.server_of("ep")
    dead = a if first == a.url else b
    dead.dead = "rlvr serve process exited"
    asyncio.run(pool.generate([10, 11], PARAMS, seed=1, session_id="ep"))
    assert pool.server_of("ep") != first and pool.server_of("ep") is not None
