"""``rollout_timeout_s`` times an environment's and an agent's own work, never a row's wait for a
shared generation: a slow machine slows a run and does not fail it, while a hung environment still
times out (rlvr.rollouts.clock)."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from rlvr.data.tasks import load_tasks
from rlvr.errors import RLLoopError
from rlvr.protocols import RolloutSetup
from rlvr.rollouts.agents import agent_rollout
from rlvr.rollouts.clock import Clocked, RolloutClock, bounded
from rlvr.rollouts.episodes import multi_turn, single_turn
from rlvr.run.evaluation import RolloutEvaluator
from rlvr.testing import FakeChatTokenizer, FakeGenerator, exact_match
from rlvr.types import RolloutRequest, SamplingParams

TOK = FakeChatTokenizer()


class SlowGenerator(FakeGenerator):
    """A generator on a busy machine: every answer comes ``delay_s`` late (a row queued behind a batch)."""

    def __init__(self, delay_s: float, respond=lambda prompt, seed: "5"):
        super().__init__(respond, tokenizer=TOK)
        self.delay_s = delay_s

    async def generate(self, prompt_ids, params, *, seed):
        await asyncio.sleep(self.delay_s)
        return await super().generate(prompt_ids, params, seed=seed)


def tasks(n: int = 3):
    return load_tasks([{"prompt": f"{i}+5=", "answer": "5"} for i in range(n)])


def request(task):
    return RolloutRequest(task, 0, 0, 7)


def test_waiting_for_a_slow_generation_is_not_the_rollouts_time():
    fn = bounded(single_turn(RolloutSetup(SlowGenerator(0.6), TOK, SamplingParams())), 0.2)
    out = asyncio.run(fn(request(tasks(1)[0])))
    assert out.text.startswith("5")


def test_a_held_out_pass_behind_a_slow_batch_scores_instead_of_failing():
    setup = RolloutSetup(SlowGenerator(0.5), TOK, SamplingParams())
    report = RolloutEvaluator(single_turn(setup), exact_match, rollout_timeout_s=0.1)(0, tasks())
    assert report.score == 1.0 and report.n == 3


class SlowToolEnv:
    """An environment whose own turn hangs (a tool call that does not return)."""

    def __init__(self, hang_s: float):
        self.hang_s = hang_s

    def reward_fn(self, messages, answer):
        return 1.0

    def interact(self, messages, state):
        time.sleep(self.hang_s)
        return [{"role": "user", "content": "again"}]


def test_an_environment_that_hangs_still_times_out_however_slow_generation_is():
    setup = RolloutSetup(SlowGenerator(0.3), TOK, SamplingParams(), env=SlowToolEnv(1.0))
    fn = bounded(multi_turn(setup, max_turns=3), 0.4)
    started = time.monotonic()
    with pytest.raises(TimeoutError, match=r"rollout_timeout_s=0.4s of the rollout's own time"):
        asyncio.run(fn(request(tasks(1)[0])))
    assert time.monotonic() - started < 5
    with pytest.raises(RLLoopError, match=r"held-out task .*rollout_timeout_s=0.4s"):
        RolloutEvaluator(multi_turn(setup, max_turns=3), exact_match, rollout_timeout_s=0.4)(0, tasks(1))


def make_slow_rollout(setup):
    """A user's ``make_rollout_fn``: a little work of its own, then 1 s of generation."""
    async def rollout(row):
        await asyncio.sleep(0.05)
        first = await setup.generator.generate([1, 2], setup.params, seed=1)
        second = await setup.generator.generate([1, 2], setup.params, seed=2)
        return [first, second]

    return rollout


def test_a_users_rollout_factory_is_timed_on_its_own_work_only():
    pytest.importorskip("transformers")
    from rlvr.backends.rollout.setup import rollout_fn_for
    from rlvr.session import registered

    gen = SlowGenerator(0.5)
    with registered({"make_slow_rollout": make_slow_rollout}) as specs:
        fn = rollout_fn_for(RolloutSetup(gen, TOK, SamplingParams()), rollout=specs["make_slow_rollout"], max_turns=1)
    assert len(asyncio.run(bounded(fn, 0.3)(request(tasks(1)[0])))) == 2
    bare = bounded(make_slow_rollout(RolloutSetup(gen, TOK, SamplingParams())), 0.3)  # nobody stopped its clock
    with pytest.raises(TimeoutError):
        asyncio.run(bare(request(tasks(1)[0])))


class FakeGateway:
    """The recording proxy's shape: the agent's calls reach ``generator`` on another thread's loop."""

    def __init__(self):
        self.generator = None

    def open(self, generator, params, *, seed=None, meta=None):
        self.generator = generator
        return "s1", "http://proxy/s1"

    def close(self, session):
        return _Episode()  # no segments: what the episode recorded is not what these tests look at


class _Episode:
    calls: list = []
    turns: list = []
    segments: list = []


def test_an_agents_model_calls_through_the_proxy_stop_its_clock_from_another_thread():
    gateway = FakeGateway()
    gen = SlowGenerator(0.5)

    def agent(base_url, row):  # blocks on two model calls made from the proxy's thread, 1 s in all
        loop = asyncio.new_event_loop()
        try:
            for seed in (1, 2):
                loop.run_until_complete(gateway.generator.generate([1, 2], SamplingParams(), seed=seed))
        finally:
            loop.close()
        return "5"

    fn = bounded(agent_rollout(RolloutSetup(gen, TOK, SamplingParams()), agent, gateway), 0.3)
    with pytest.raises(Exception) as caught:  # the fake episode has no segments: the agent ran to its end
        asyncio.run(fn(request(tasks(1)[0])))
    assert "made no model call" in str(caught.value) and not isinstance(caught.value, TimeoutError)
    assert isinstance(gateway.generator, Clocked) and gateway.generator.clock is not None


def test_an_agent_busy_between_its_calls_times_out():
    gateway = FakeGateway()

    def agent(base_url, row):
        time.sleep(2.0)  # its own work, far past the bound
        return "5"

    fn = bounded(agent_rollout(RolloutSetup(SlowGenerator(0.0), TOK, SamplingParams()), agent, gateway), 0.2)
    with pytest.raises(TimeoutError, match="rollout_timeout_s=0.2s"):
        asyncio.run(fn(request(tasks(1)[0])))


def test_the_clock_stands_still_while_any_call_waits_from_any_thread():
    now = [0.0]
    clock = RolloutClock(10.0, now=lambda: now[0])
    now[0] = 2.0
    with clock.waiting():
        now[0] = 5.0
        done = threading.Event()

        def other():
            with clock.waiting():  # a concurrent call from another thread: counted once
                now[0] = 7.0
            done.set()

        threading.Thread(target=other).start()
        done.wait(5)
        assert clock.stopped and clock.used() == 2.0
        now[0] = 9.0
    now[0] = 10.0
    assert not clock.stopped and clock.used() == 3.0 and clock.left() == 7.0


def test_a_clocked_generator_takes_what_the_generator_it_wraps_takes():
    # A server pool keeps an agent's episode on one replica by the session id the proxy passes when the
    # generator's signature takes one: the clock's wrapper must not hide it.
    import inspect

    class Pool:
        def __init__(self):
            self.sessions = []

        async def generate(self, prompt_ids, params, *, seed, session_id=None):
            self.sessions.append(session_id)
            return len(prompt_ids)

    pool = Pool()
    clocked = Clocked(pool, RolloutClock(10.0))
    assert "session_id" in inspect.signature(clocked.generate).parameters
    assert asyncio.run(clocked.generate([1, 2, 3], None, seed=0, session_id="episode-7")) == 3
    assert pool.sessions == ["episode-7"]
