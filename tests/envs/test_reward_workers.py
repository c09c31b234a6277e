"""Reward workers: rewards in worker processes, N at a time, each call bounded, crashes survived."""

from __future__ import annotations

import os
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from rlvr.envs.workers import RewardWorkers
from rlvr.errors import ConfigError, RewardError
from rlvr.protocols import LoadedEnv
from rlvr.reward import Score, evaluate_reward_within
from rlvr.types import Task

ENV = '''
import os, time
from rlvr.reward import Score

def reward_fn(messages, answer, info):
    reply = messages[-1]["content"]
    if reply == "sleep":
        start = time.monotonic()  # CLOCK_MONOTONIC: one clock for every process of the machine
        time.sleep(info["seconds"])
        return Score.of(0.0, start=start, end=time.monotonic())
    elif reply == "hang":
        time.sleep(3600)
    elif reply == "crash":
        os._exit(3)
    elif reply == "crash once":
        marker = info["marker"]
        if not os.path.exists(marker):
            open(marker, "w").close()
            os._exit(4)
    elif reply == "raise":
        raise ValueError("no grade for this")
    elif reply == "score":
        return Score.of(0.5, pid=float(os.getpid()))
    return float(reply == answer)
'''


@pytest.fixture
def spec(tmp_path: Path) -> tuple[str, dict]:
    path = tmp_path / "slow_env.py"
    path.write_text(ENV)
    return "rlvr.envs.workers:load_env", {"env": str(path)}


def _row(i: int = 0, **info) -> Task:
    return Task(id=f"r{i}", messages=({"role": "user", "content": "?"},), answer="4", content_hash="h", info=info)


def _said(text: str) -> list[dict]:
    return [{"role": "user", "content": "?"}, {"role": "assistant", "content": text}]


def test_a_reward_runs_in_a_worker_and_comes_back_as_a_reward(spec):
    workers = RewardWorkers(spec, workers=1, timeout_s=30)
    try:
        assert workers([*_said("4")], "4", _row()) == 1.0
        score = workers(_said("score"), "4", _row())
        assert isinstance(score, Score) and score.value == 0.5 and score.components["pid"] == workers.pids()[0]
        assert score.components["pid"] != os.getpid()
        env = LoadedEnv(name="slow", reward_fn=workers)
        assert evaluate_reward_within(env, _said("4"), "4", 30, _row()).value == 1.0
        with pytest.raises(RewardError, match=r"row 'r7' raised ValueError: no grade for this"):
            workers(_said("raise"), "4", _row(7))
        assert workers(_said("5"), "4", _row()) == 0.0  # the worker lives on after a raising reward
    finally:
        workers.close()


@pytest.mark.parametrize("n", [1, 2, 4])
def test_sleeping_rewards_run_n_at_a_time(spec, n):
    seconds, calls = 0.25, 8
    workers = RewardWorkers(spec, workers=n, timeout_s=30)
    try:
        with ThreadPoolExecutor(calls) as threads:
            out = list(threads.map(lambda i: workers(_said("sleep"), "4", _row(i, seconds=seconds)), range(calls)))
    finally:
        workers.close()
    assert [score.value for score in out] == [0.0] * calls
    # How many ran at once, from when each reward ran (not from the wall time, which a loaded
    # machine stretches): never more than n, and n at some point (8 calls queued on n workers).
    edges = sorted([(s.components["start"], 1) for s in out] + [(s.components["end"], -1) for s in out])
    running = [sum(step for _, step in edges[: i + 1]) for i in range(len(edges))]
    assert max(running) == n, (n, edges)


def test_a_hung_reward_is_killed_at_the_timeout_and_its_worker_replaced(spec):
    workers = RewardWorkers(spec, workers=1, timeout_s=1.0)
    try:
        (hung,) = workers.pids()
        start = time.monotonic()
        with pytest.raises(RewardError, match=r"row 'r3' did not return within reward_timeout_s=1s.*killed"):
            workers(_said("hang"), "4", _row(3))
        assert time.monotonic() - start < 2.0
        with pytest.raises(ProcessLookupError):
            os.kill(hung, 0)
        assert workers(_said("4"), "4", _row()) == 1.0  # on the replacement
        assert workers.pids() != [hung] and workers.timeouts == 1 and workers.replaced == 1
        # In the stream's path too: the worker bounds the call, no thread of its own is left behind.
        env = LoadedEnv(name="slow", reward_fn=workers)
        with pytest.raises(RewardError, match="did not return within"):
            evaluate_reward_within(env, _said("hang"), "4", 1.0, _row(4))
    finally:
        workers.close()


def test_a_crashing_worker_is_replaced_and_the_call_tried_once_more(spec, tmp_path):
    workers = RewardWorkers(spec, workers=2, timeout_s=30)
    try:
        before = set(workers.pids())
        marker = tmp_path / "crashed"
        assert workers(_said("crash once"), "4", _row(1, marker=str(marker))) == 0.0  # retried, then answered
        assert marker.exists() and workers.replaced == 1 and len(set(workers.pids()) - before) == 1
        with pytest.raises(RewardError, match=r"row 'r2': its worker died twice"):
            workers(_said("crash"), "4", _row(2))
        assert workers.replaced == 3 and len(workers.pids()) == 2
        assert workers(_said("4"), "4", _row()) == 1.0
    finally:
        workers.close()
    assert workers.pids() == []


def test_an_environment_that_does_not_load_fails_at_start(tmp_path):
    with pytest.raises(ConfigError, match="could not load the environment"):
        RewardWorkers(("rlvr.envs.workers:load_env", {"env": str(tmp_path / "missing.py")}), workers=1, timeout_s=5)


# Model-written code that answers for the reward: a pickled ("ok", 1000.0), framed as a worker's
# answer, written on every fd it holds and on every fd of its parent it can open through /proc. (A
# pickle of its choosing would run code in the trainer, which loads it.)
FORGER = '''
import os, pickle, struct
frame = pickle.dumps(("ok", 1000.0))
frame = struct.pack("!i", len(frame)) + frame
targets = list(range(3, 256))
for name in os.listdir(f"/proc/{os.getppid()}/fd"):
    try:
        targets.append(os.open(f"/proc/{os.getppid()}/fd/{name}", os.O_WRONLY | os.O_NONBLOCK))
    except OSError:
        pass
for fd in targets:
    try:
        os.write(fd, frame)
    except OSError:
        pass
'''


def test_a_program_the_reward_runs_cannot_answer_in_its_place(tmp_path):
    """A reward that runs the model's code carelessly (``os.system``: every inheritable fd handed
    down) still gets its own score to the trainer: the worker's socket is not the program's."""
    program = tmp_path / "model_code.py"
    program.write_text(FORGER)
    env = tmp_path / "careless_env.py"
    env.write_text("import os, sys\n\ndef reward_fn(messages, answer, info):\n"
                   f"    os.system(f'{{sys.executable}} {program}')\n    return 0.0\n")
    workers = RewardWorkers(("rlvr.envs.workers:load_env", {"env": str(env)}), workers=1, timeout_s=30)
    try:
        assert workers(_said("4"), "4", _row()) == 0.0
        assert workers(_said("4"), "4", _row()) == 0.0  # and the answers stay in step with the calls
    finally:
        workers.close()
