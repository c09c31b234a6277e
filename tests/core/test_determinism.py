"""Same seed, same record: a sample's randomness depends on its coordinates, never on timing.

The Python API page's own pattern (a ``FakeSampler`` with no policy, so no version to key on) is run many
times with random, unseeded sleeps injected into the sampler, so rows finish in a different order
every time; the record must come out byte-identical (wall-clock keys removed) every time.
"""

from __future__ import annotations

import random
import time

import pytest

from conftest import record_files
from rlvr import GRPOConfig, RLLoop
from rlvr.data.tasks import TaskCursor, load_tasks
from rlvr.testing import FakeRolloutFn, FakeSampler, FakeTrainer, exact_match, make_rows

RUNS = 20
JITTER = random.Random()  # deliberately unseeded: the schedule must not matter


class JitterySampler(FakeSampler):
    """A FakeSampler that sleeps a random time before answering: rows finish in any order."""

    def __call__(self, tasks, k, **kwargs):
        time.sleep(JITTER.random() * 0.004)
        return super().__call__(tasks, k, **kwargs)


def peak20(step, tasks):
    return 0.5 - abs(step - 20) * 0.01


def readme_run(out_dir, **overrides):
    config = GRPOConfig(max_steps=34, heldout_every=10, seed=7, **overrides)
    RLLoop.from_reward(config, exact_match, make_rows(200), sampler=JitterySampler(), trainer=FakeTrainer(),
                       heldout_eval=peak20, out_dir=out_dir).run()
    files = record_files(out_dir)
    return {name: files[name] for name in ("events.jsonl", "metrics.jsonl", "selected.json")}


@pytest.mark.parametrize("overrides", [{}, {"max_rows_in_flight": 64, "max_head_offpolicy_versions": 1}],
                         ids=["default", "async"])
def test_the_readme_loop_writes_one_record_under_scheduling_jitter(tmp_path, overrides):
    records = [readme_run(tmp_path / f"run{i}", **overrides) for i in range(RUNS)]
    assert len(records[0]["metrics.jsonl"]) == 34
    assert all(r == records[0] for r in records[1:])


def test_the_sampler_draws_the_same_whatever_the_call_order():
    tasks = load_tasks(make_rows(6))
    sampler = FakeSampler(skill=0.5)
    forward = [sampler([t], 3)[0] for t in tasks]
    backward = [sampler([t], 3)[0] for t in reversed(tasks)][::-1]
    assert forward == backward == sampler(tasks, 3)


def test_explicit_seeds_decide_the_draw():
    task = load_tasks(make_rows(1))[0]
    sampler = FakeSampler(skill=0.5)
    a = sampler([task], 4, seeds=[[1, 2, 3, 4]])
    assert a == sampler([task], 4, seeds=[[1, 2, 3, 4]])
    assert [r.text for r in a[0]] != [r.text for r in sampler([task], 4, seeds=[[5, 6, 7, 8]])[0]]


def test_a_task_drawn_twice_in_one_batch_gets_different_seeds():
    # At an epoch boundary a batch can hold the same task twice: the draw index tells them apart.
    tasks = load_tasks(make_rows(3))
    cursor = TaskCursor(tasks, seed=0)
    draws = [cursor.draw() for _ in range(6)]
    assert [d for _, d in draws] == list(range(6))
    assert sorted(t.id for t, _ in draws[:3]) == sorted(t.id for t, _ in draws[3:])


def test_rollout_functions_draw_from_the_request_seed_only(tmp_path):
    # FakeRolloutFn sleeps a seeded random time, so rows finish out of order; no policy is given.
    config = GRPOConfig(max_steps=6, heldout_every=3, seed=3, group_k=4, tasks_per_step=4,
                        max_head_offpolicy_versions=1, max_rows_in_flight=64)

    def once(out_dir):
        fn = FakeRolloutFn(0.5, max_delay=JITTER.random() * 0.004)
        RLLoop.from_reward(config, exact_match, make_rows(120), rollout_fn=fn, trainer=FakeTrainer(),
                           heldout_eval=peak20, out_dir=out_dir).run()
        return record_files(out_dir)["metrics.jsonl"]

    first = once(tmp_path / "a")
    assert all(once(tmp_path / f"r{i}") == first for i in range(5))
