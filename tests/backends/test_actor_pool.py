"""The reward actor pool's policy, over fake slots (no cluster): bounded calls, restarts recorded,
dead actors replaced and the call retried, and the warnings reaching the run record."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from rlvr.backends.cluster.actor_pool import ActorRewardPool
from rlvr.config import GRPOConfig
from rlvr.errors import ActorLost, ActorTimeout, ConfigError, RewardError
from rlvr.protocols import LoadedEnv
from rlvr.reward import evaluate_reward_within
from rlvr.run.loop import RLLoop
from rlvr.testing import FakeRolloutFn, FakeTrainer, ScriptedEvaluator, exact_match, make_rows
from rlvr.types import Task


class FakeSlot:
    """An actor that answers from a script: each item a value, an exception to raise, or
    ``("pid", n)`` to answer from process ``n`` from then on."""

    def __init__(self, name: str, script: list[Any] | None = None, pid: int = 100, replacement: Any = None):
        self.name, self.script, self.pid, self.replacement = name, list(script or []), pid, replacement
        self.restarts = self.kills = 0
        self.calls: list[tuple] = []

    def call(self, payload: tuple, timeout_s: float | None) -> tuple[str, Any, int]:
        self.calls.append(payload)
        step = self.script.pop(0) if self.script else "ok"
        while isinstance(step, tuple) and step[0] == "pid":
            self.pid = step[1]
            step = self.script.pop(0) if self.script else "ok"
        if isinstance(step, BaseException):
            raise step
        if step == "raise":
            return "raised", "ValueError: no grade", self.pid
        messages, answer, _row = payload
        return "ok", float(messages[-1]["content"] == answer), self.pid

    def restart(self) -> None:
        self.restarts += 1
        self.pid += 1

    def replace(self) -> FakeSlot:
        if isinstance(self.replacement, BaseException):
            raise self.replacement
        return self.replacement or FakeSlot(f"{self.name}'", pid=self.pid + 1000)

    def where(self) -> dict[str, Any]:
        return {"node_id": "n1", "ip": "10.0.0.1", "pid": self.pid}

    def kill(self) -> None:
        self.kills += 1


def _row(i: int = 0) -> Task:
    return Task(id=f"r{i}", messages=({"role": "user", "content": "?"},), answer="4", content_hash="h")


def _said(text: str) -> list[dict]:
    return [{"role": "user", "content": "?"}, {"role": "assistant", "content": text}]


def _pool(*slots: FakeSlot, timeout_s: float | None = 5.0) -> tuple[ActorRewardPool, list[str]]:
    lines: list[str] = []
    return ActorRewardPool(list(slots), timeout_s=timeout_s, env_name="addition", log=lines.append), lines


def test_a_call_is_scored_by_an_actor_and_an_error_it_reports_names_the_row():
    slot = FakeSlot("reward actor 0", ["ok", "raise", "ok"])
    pool, lines = _pool(slot)
    assert pool(_said("4"), "4", _row()) == 1.0
    with pytest.raises(RewardError, match=r"'addition' on row 'r3' raised ValueError: no grade"):
        pool(_said("4"), "4", _row(3))
    assert pool(_said("5"), "4", _row()) == 0.0  # the actor lives on after the reward's own error
    assert pool.calls == 3 and pool.take_warnings() == [] and lines == []
    assert pool.takes_task and pool.bounds_itself


def test_an_actor_that_overruns_is_restarted_and_the_row_named():
    slot = FakeSlot("reward actor 0", [ActorTimeout(), ("pid", 101), "ok"])
    pool, lines = _pool(slot, timeout_s=0.5)
    with pytest.raises(RewardError, match=r"row 'r7' did not return within reward_timeout_s=0.5s.*restarted by ray"):
        pool(_said("4"), "4", _row(7))
    assert slot.restarts == 1 and pool.timeouts == 1
    (warning,) = pool.take_warnings()
    assert warning["warning"] == "reward_worker_timeout" and warning["worker"] == "reward actor 0"
    assert pool(_said("4"), "4", _row()) == 1.0  # the restarted process answers: not counted as a death
    assert pool.restarted == 0 and pool.take_warnings() == [] and len(lines) == 1


def test_an_actor_the_engine_restarted_by_itself_is_recorded_with_its_node():
    slot = FakeSlot("reward actor 1", ["ok", ("pid", 555), "ok"])
    pool, lines = _pool(slot)
    assert pool(_said("4"), "4", _row()) == 1.0
    assert pool(_said("4"), "4", _row(2)) == 1.0  # the engine restarted it and retried the call
    (warning,) = pool.take_warnings()
    assert warning["warning"] == "reward_worker_restarted" and warning["node"]["ip"] == "10.0.0.1"
    assert "process 100 died" in warning["reason"] and "process 555" in warning["reason"]
    assert "row 'r2'" in warning["reason"] and pool.restarted == 1
    assert "reward actor 1" in lines[0]


def test_an_actor_gone_for_good_is_replaced_and_the_call_tried_again_on_the_new_one():
    new = FakeSlot("reward actor 0'", pid=900)
    dead = FakeSlot("reward actor 0", [ActorLost("reward actor 0 died (killed)")], replacement=new)
    pool, _ = _pool(dead)
    assert pool(_said("4"), "4", _row(5)) == 1.0
    assert len(new.calls) == 1 and pool.replaced == 1
    (warning,) = pool.take_warnings()
    assert warning["warning"] == "reward_worker_replaced" and warning["replacement"]["pid"] == 900
    assert pool.describe()["actors"] == [new.where()]
    assert pool(_said("4"), "4", _row()) == 1.0 and len(new.calls) == 2  # the replacement serves from now on


def test_a_row_that_kills_two_actors_in_a_row_is_a_sample_error():
    second = FakeSlot("b", [ActorLost("b died")])
    first = FakeSlot("a", [ActorLost("a died")], replacement=second)
    pool, _ = _pool(first)
    with pytest.raises(RewardError, match=r"row 'r9': its worker died twice \(last: b died\)"):
        pool(_said("4"), "4", _row(9))
    assert pool.replaced == 2


def test_no_actor_left_is_an_error_not_a_hang():
    slot = FakeSlot("a", [ActorLost("a died")], replacement=RuntimeError("cluster lost"))
    pool, _ = _pool(slot)
    with pytest.raises(RuntimeError, match="cluster lost"):
        pool(_said("4"), "4", _row())
    with pytest.raises(RewardError, match="no reward worker is left"):
        pool(_said("4"), "4", _row())


def test_calls_wait_for_a_free_actor_and_every_actor_is_used():
    gate = threading.Barrier(2, timeout=5)

    class Meeting(FakeSlot):
        def call(self, payload, timeout_s):  # both calls must be in flight at once to pass the barrier
            gate.wait()
            return super().call(payload, timeout_s)

    a, b = Meeting("a"), Meeting("b", pid=200)
    pool, _ = _pool(a, b)
    results: list[float] = []
    threads = [threading.Thread(target=lambda: results.append(pool(_said("4"), "4", _row()))) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert results == [1.0, 1.0] and len(a.calls) == len(b.calls) == 1


def test_the_pool_bounds_itself_so_no_thread_bound_is_added_and_close_kills_every_actor():
    class Slow(FakeSlot):
        def call(self, payload, timeout_s):
            time.sleep(0.05)  # longer than the caller's bound below: only the pool's own bound may apply
            return super().call(payload, timeout_s)

    a, b = Slow("a"), FakeSlot("b")
    pool, _ = _pool(a, b)
    env = LoadedEnv(reward_fn=pool, name="addition")
    assert evaluate_reward_within(env, _said("4"), "4", 0.01, _row()).value == 1.0
    pool.close()
    pool.close()
    assert a.kills == b.kills == 1


def test_an_empty_pool_is_refused():
    with pytest.raises(ConfigError, match="reward_workers >= 1"):
        ActorRewardPool([], timeout_s=1.0)


def test_the_pools_warnings_become_warning_events_of_the_run():
    class Reward:
        def __init__(self):
            self.pending = [{"warning": "reward_worker_restarted", "worker": "reward actor 0", "reason": "test"}]

        def __call__(self, messages, answer):
            return exact_match(messages, answer)

        def take_warnings(self):
            out, self.pending = self.pending, []
            return out

    cfg = GRPOConfig(max_steps=2, tasks_per_step=4, group_k=2, heldout_every=2, corpus_min=10)
    loop = RLLoop.from_reward(cfg, LoadedEnv(reward_fn=Reward(), name="fake"), make_rows(40),
                              rollout_fn=FakeRolloutFn(), trainer=FakeTrainer(),
                              heldout_eval=ScriptedEvaluator({0: 0.1, 2: 0.2}))
    record = loop.run()
    warnings = [e.data for e in record.of_kind("warning")]
    assert warnings == [{"warning": "reward_worker_restarted", "worker": "reward actor 0", "reason": "test"}]
