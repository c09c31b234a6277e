"""The loop over the rollout stream: staleness, the ledger of rows, filtering and sample errors."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections import Counter

import pytest

from conftest import N_ROWS, small_config
from rlvr import RLLoop, RLLoopError
from rlvr.record.run_record import strip_timing
from rlvr.testing import FakeRolloutFn, FakeTrainer, ScriptedEvaluator, exact_match, make_rows


class SlowTrainer(FakeTrainer):
    """A FakeTrainer that takes ``seconds`` per step (time for sampling to overlap it)."""

    def __init__(self, seconds: float = 0.0):
        super().__init__()
        self.seconds = seconds

    def __call__(self, batch):
        time.sleep(self.seconds)
        return super().__call__(batch)


def run(config, *, skill=lambda v: min(0.9, 0.2 + 0.05 * v), max_delay=0.0, train_seconds=0.0,
        reward=exact_match, rollout_fn=None, out_dir=None, **kwargs):
    resume = kwargs.pop("resume", False)
    trainer = SlowTrainer(train_seconds)
    fn = rollout_fn(trainer) if rollout_fn else FakeRolloutFn(skill, policy=trainer, seed=config.seed,
                                                              max_delay=max_delay)
    loop = RLLoop.from_reward(config, reward, make_rows(N_ROWS), rollout_fn=fn, trainer=trainer,
                              heldout_eval=ScriptedEvaluator(lambda s: 0.1), out_dir=out_dir, **kwargs)
    return loop, trainer, loop.run(resume=resume)


def ledger_balances(record) -> bool:
    """Every admitted row was trained, filtered with a reason, or left unconsumed at the end."""
    steps = record.of_kind("step")
    trained = sum(len(e.data["task_ids"]) for e in steps)
    filtered = sum(len(e.data["filtered"]) for e in steps) + len(record.finished.data["filtered_after_last_step"])
    assert all(d["reason"] for e in steps for d in e.data["filtered"])
    return record.finished.data["rows_admitted"] == trained + filtered + len(record.finished.data["unconsumed_rows"])


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("offpolicy", [0, 1, 2])
def test_random_delays_never_train_a_sample_older_than_the_bound(seed, offpolicy):
    # With the filter on, groups of 4: with 2 samples every row of a batch is filtered too often. Which rows
    # a step admits follows the random delays (the machine's timing), so the filter may meet a run of flat
    # groups: room for 4x the batch keeps that run from exhausting it, which is not what is tested here.
    filtering = seed % 2 == 0
    cfg = small_config(seed=seed, max_steps=8, max_head_offpolicy_versions=offpolicy, group_k=4 if filtering else 2,
                       filter_zero_variance=filtering, max_rows_in_flight=[None, 2, 5][seed % 3],
                       max_oversample=4.0 if filtering else 2.0)
    loop, trainer, record = run(cfg, max_delay=0.003, train_seconds=0.002)
    assert [c.step for c in trainer.calls] == list(range(1, 9))
    for call in trainer.calls:
        offsets = {(call.step - 1) - r.version for r in call.rollouts}
        assert offsets and max(offsets) <= offpolicy and min(offsets) >= 0
    assert ledger_balances(record)
    # Groups stay whole unless a sample was dropped: nothing else shrinks them.
    assert all(len(c.rollouts) % cfg.group_k == 0 for c in trainer.calls)


def test_offpolicy_zero_trains_exactly_what_synchronous_training_trains():
    def trained(**extra):
        _, trainer, record = run(small_config(max_steps=6, filter_zero_variance=True, **extra), max_delay=0.002)
        return [([r.task_id for r in c.rollouts], [r.reward for r in c.rollouts], c.advantages)
                for c in trainer.calls], [e.data["task_ids"] for e in record.of_kind("step")]

    assert trained() == trained(synchronous_training=True)


def test_offpolicy_one_samples_while_the_trainer_trains():
    cfg = small_config(max_steps=6, max_head_offpolicy_versions=1)
    loop, _, record = run(cfg, max_delay=0.08, train_seconds=0.02)
    overlap = [m["perf/overlap_ratio"] for m in record.metrics]
    assert max(overlap) > 0.5  # rows for the next batch sample during the train step
    assert max(m["async/version_offset_max"] for m in record.metrics) == 1


def test_synchronous_training_samples_nothing_during_a_train_step():
    cfg = small_config(max_steps=5, synchronous_training=True)
    loop, _, record = run(cfg, max_delay=0.002, train_seconds=0.02)
    assert all(m["perf/overlap_ratio"] == 0.0 for m in record.metrics)
    assert record.finished.data["unconsumed_rows"] == []  # nothing sampled ahead


def test_nothing_is_sampled_past_the_last_step():
    # O = 0 samples the next batch while a step is evaluated and checkpointed, but after the last
    # step there is no next batch: sampling it would only slow the final held-out evaluation.
    cfg = small_config(max_steps=4)
    _, trainer, record = run(cfg, max_delay=0.002)
    assert len(trainer.calls) == 4
    assert record.finished.data["unconsumed_rows"] == []
    assert record.finished.data["rows_admitted"] == 4 * cfg.tasks_per_step


def test_zero_variance_groups_are_filtered_and_replaced_until_the_batch_is_full():
    cfg = small_config(max_steps=6, filter_zero_variance=True, max_oversample=4.0)
    _, trainer, record = run(cfg, skill=0.5)
    for call in trainer.calls:
        groups = [call.rollouts[i:i + cfg.group_k] for i in range(0, len(call.rollouts), cfg.group_k)]
        assert len(groups) == cfg.tasks_per_step
        assert all(len({r.reward for r in g}) > 1 for g in groups)
    reasons = Counter(d["reason"] for e in record.of_kind("step") for d in e.data["filtered"])
    assert reasons and all(r.startswith("zero reward variance") for r in reasons)
    ratios = [m["rollout/filter_drop_ratio"] for m in record.metrics]
    assert max(ratios) > 0


def test_the_oversampling_cap_trains_on_what_there_is_and_says_so():
    # Keep groups of rows whose id sorts low (about 5 in 8); the cap (6 rows for 4 slots) stops the refill.
    cfg = small_config(max_steps=6, tasks_per_step=4, max_oversample=1.5)
    keep_low = lambda g: g.task.id < "a" or "high id"  # noqa: E731
    _, trainer, record = run(cfg, skill=0.5, dynamic_filter=keep_low)
    steps = record.of_kind("step")
    assert any(e.data["short"] for e in steps) and not all(e.data["short"] for e in steps)
    assert all(e.data["admitted"] <= 6 for e in steps)
    assert all(r.task_id < "a" for c in trainer.calls for r in c.rollouts)
    assert all(len(c.rollouts) <= cfg.tasks_per_step * cfg.group_k for c in trainer.calls)


def test_a_batch_with_every_row_filtered_stops_with_the_reasons():
    cfg = small_config(max_steps=3)
    with pytest.raises(RLLoopError, match=r"all 6 rows admitted for this batch were filtered .*'never'"):
        run(cfg, dynamic_filter=lambda g: "never")


def raising_rollout(trainer):
    inner = FakeRolloutFn(0.5, policy=trainer)

    async def rollout(row):
        if row.index == 0:
            raise TimeoutError(f"tool timed out for {row.id}")
        return await inner(row)

    return rollout


def test_drop_policy_counts_raising_samples_and_shrinks_their_groups():
    cfg = small_config(max_steps=3, group_k=3, on_sample_error="drop")
    _, trainer, record = run(cfg, rollout_fn=raising_rollout)
    assert all(len(c.rollouts) == cfg.tasks_per_step * 2 for c in trainer.calls)
    drops = [d for e in record.of_kind("step") for d in e.data["sample_drops"]]
    assert drops and all(d["sample"] == 0 and "TimeoutError: tool timed out" in d["reason"] for d in drops)
    assert all(m["rollout/sample_drops"] == cfg.tasks_per_step for m in record.metrics)


def test_fail_policy_names_the_row_sample_and_exception():
    with pytest.raises(RLLoopError, match=r"row '[^']+' sample 0: rollout raised TimeoutError: tool timed out"):
        run(small_config(max_steps=3, group_k=3), rollout_fn=raising_rollout)


def test_a_group_below_the_minimum_is_filtered_with_the_count():
    cfg = small_config(max_steps=2, group_k=3, min_group_size=3, on_sample_error="drop", max_oversample=1.0)
    with pytest.raises(RLLoopError, match=r"2 of 3 samples usable, below min_group_size=3"):
        run(cfg, rollout_fn=raising_rollout)


def test_a_reward_of_none_drops_the_sample_as_not_applicable():
    def reward(messages, answer):
        return None if messages[-1]["content"].startswith("not") else 1.0

    cfg = small_config(max_steps=3, min_group_size=1)
    _, trainer, record = run(cfg, skill=0.6, reward=reward)
    assert all(r.reward == 1.0 for c in trainer.calls for r in c.rollouts)
    drops = [d["reason"] for e in record.of_kind("step") for d in e.data["sample_drops"]]
    assert drops and set(drops) == {"reward does not apply (None)"}


def test_a_stale_server_after_publishing_stops_the_run():
    with pytest.raises(RLLoopError, match="serves policy version 0 after publishing version 1"):
        run(small_config(max_steps=2), weight_sync=lambda version: 0)


def test_sampler_and_rollout_fn_together_are_refused():
    trainer = FakeTrainer()
    loop = RLLoop.from_reward(small_config(), exact_match, make_rows(N_ROWS), sampler=lambda t, k: [],
                              rollout_fn=FakeRolloutFn(), trainer=trainer,
                              heldout_eval=ScriptedEvaluator(lambda s: 0.1))
    with pytest.raises(RLLoopError, match="either sampler"):
        loop.run()


def test_async_resume_recovers_pending_rows_without_losing_any(tmp_path):
    from conftest import AbortAfter

    cfg = small_config(max_steps=8, max_head_offpolicy_versions=1, heldout_every=3)
    _, first, cut = run(cfg, out_dir=tmp_path, should_abort=AbortAfter(4))
    assert cut.finished.data["stop_cause"] == "aborted"
    state_pending = len(cut.finished.data["unconsumed_rows"])
    assert state_pending > 0  # O = 1 had the next batch(es) sampling at the abort
    _, second, resumed = run(cfg, out_dir=tmp_path, resume=True)
    assert [c.step for c in first.calls + second.calls] == list(range(1, 9))
    first_after = [r.task_id for r in second.calls[0].rollouts[:: cfg.group_k]]
    assert set(first_after) <= set(cut.finished.data["unconsumed_rows"])  # pending rows come first


def test_a_rollout_that_never_returns_is_bounded_by_the_timeout():
    def hanging(trainer):
        inner = FakeRolloutFn(0.5, policy=trainer)

        async def rollout(row):
            if row.index == 1:
                await asyncio.sleep(3600)
            return await inner(row)

        return rollout

    cfg = small_config(max_steps=2, group_k=3, rollout_timeout_s=0.05, on_sample_error="drop")
    started = time.monotonic()
    _, trainer, record = run(cfg, rollout_fn=hanging)
    assert time.monotonic() - started < 30
    drops = [d for e in record.of_kind("step") for d in e.data["sample_drops"]]
    assert drops and all(d["sample"] == 1 and "no sample within rollout_timeout_s=0.05s" in d["reason"]
                         for d in drops)
    assert all(len(c.rollouts) == cfg.tasks_per_step * 2 for c in trainer.calls)


def segmented_rollout(trainer):
    """Sample 0: one single-turn rollout. Sample 1: an episode of two segments, the first holding two
    model turns around a tool reply (mask 0), the second one more turn over the re-rendered context."""
    inner = FakeRolloutFn(0.5, policy=trainer)

    async def rollout(row):
        base = await inner(row)
        if row.index == 0:
            return base
        n = len(base.completion_ids)
        first = dataclasses.replace(
            base, completion_ids=base.completion_ids + (7, 7) + base.completion_ids,
            logprobs=base.logprobs + (0.0, 0.0) + base.logprobs, loss_mask=(1,) * n + (0, 0) + (1,) * n,
            messages=base.messages[:1])
        second = dataclasses.replace(base, prompt_ids=first.prompt_ids + first.completion_ids + (9,))
        return [first, second]

    return rollout


def test_steps_record_turns_and_trajectory_length_per_sample_and_the_scoring_time():
    def slow_reward(messages, answer):
        time.sleep(0.03)
        return exact_match(messages, answer)

    cfg = small_config(max_steps=3, filter_zero_variance=False)
    _, trainer, record = run(cfg, rollout_fn=segmented_rollout, reward=slow_reward)
    for call, metrics in zip(trainer.calls, record.metrics, strict=True):
        episodes = [call.rollouts[i:i + 3] for i in range(0, len(call.rollouts), 3)]  # sample 0, then 1's segments
        assert all(e[0].loss_mask is None and 0 in e[1].loss_mask and e[2].loss_mask is None for e in episodes)
        lengths = [n for e in episodes for n in (len(e[0].prompt_ids) + len(e[0].completion_ids),
                                                len(e[2].prompt_ids) + len(e[2].completion_ids))]
        assert metrics["rollout/n_turns"] == (1 + 3) / 2
        assert metrics["rollout/trajectory_length"] == pytest.approx(sum(lengths) / len(lengths))
        # Each row's two rewards run one after the other: 60 ms of scoring at least behind every batch.
        assert metrics["time/scoring"] >= 0.055
        assert "time/scoring" not in strip_timing(metrics) and "rollout/n_turns" in strip_timing(metrics)


def test_trajectory_counts_runs_of_generated_tokens_and_the_last_context():
    from rlvr.types import Rollout, Trajectory

    def r(prompt, mask):
        return Rollout("t", tuple(range(prompt)), (1,) * len(mask), (0.0,) * len(mask), "", (), loss_mask=mask)

    assert Trajectory.of([Rollout("t", (1, 2), (3, 4, 5), (0.0,) * 3, "", ())]) == Trajectory(1, 5)
    assert Trajectory.of([r(4, (1, 1, 0, 0, 1, 0, 1, 1))]) == Trajectory(3, 12)
    assert Trajectory.of([r(4, (0, 1, 0)), r(9, (1, 1, 0, 1))]) == Trajectory(3, 13)
    assert Trajectory.of([r(2, (0, 0))]) == Trajectory(0, 4)  # nothing generated: no model turn


def test_scoring_time_counts_overlapping_rows_once():
    from rlvr.rollouts.stream import covered

    assert covered([]) == 0.0
    assert covered([(0.0, 1.0), (0.5, 2.0), (3.0, 3.5), (3.1, 3.2)]) == pytest.approx(2.5)
    assert covered([(2.0, 4.0), (0.0, 1.0)]) == pytest.approx(3.0)
