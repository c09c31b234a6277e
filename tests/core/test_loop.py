"""RLLoop with fakes: seams, held-out schedule, selection, patience, determinism."""

from __future__ import annotations

import json

import pytest

from conftest import make_rig, record_files, rising, small_config, step_task_ids
from rlvr import EnvPlan, LoopOptions, LoopSeams, RLLoop, RLLoopError
from rlvr.testing import FakeSampler, FakeTrainer, ScriptedEvaluator, exact_match


@pytest.mark.parametrize("missing", ["sampler", "trainer", "heldout_eval"])
def test_missing_seam_is_refused_by_name(missing, rows):
    trainer = FakeTrainer()
    seams = {"sampler": FakeSampler(policy=trainer), "trainer": trainer,
             "heldout_eval": ScriptedEvaluator(lambda s: 0.5)}
    seams[missing] = None
    loop = RLLoop.from_reward(small_config(), exact_match, rows, **seams)
    with pytest.raises(RLLoopError, match=rf"RLLoop needs a {missing}: pass {missing}=\.\.\."):
        loop.run()
    assert trainer.calls == []


@pytest.mark.parametrize("bad", ["sampler", "trainer", "heldout_eval"])
def test_non_callable_seam_is_refused_by_name(bad, rows):
    trainer = FakeTrainer()
    seams = {"sampler": FakeSampler(policy=trainer), "trainer": trainer,
             "heldout_eval": ScriptedEvaluator(lambda s: 0.5)}
    seams[bad] = 42
    with pytest.raises(RLLoopError, match=rf"{bad} must be callable, got int"):
        RLLoop.from_reward(small_config(), exact_match, rows, **seams).run()


def test_heldout_is_scored_at_zero_every_n_steps_and_at_the_end():
    rig = make_rig(small_config(heldout_every=3, max_steps=8))
    record = rig.loop.run()
    assert rig.evaluator.calls == [0, 3, 6, 8]
    assert list(record.heldout_scores) == [0, 3, 6, 8]
    assert list(record.pool_scores) == list(range(1, 9))


def test_heldout_is_not_scored_twice_when_max_steps_is_a_multiple():
    rig = make_rig(small_config(heldout_every=3, max_steps=9))
    rig.loop.run()
    assert rig.evaluator.calls == [0, 3, 6, 9]


def test_evaluator_only_ever_sees_the_held_out_tasks():
    seen = []

    def evaluate(step, tasks):
        seen.append({t.id for t in tasks})
        return 0.5

    rig = make_rig(small_config(max_steps=3))
    rig.loop.heldout_eval = evaluate
    record = rig.loop.run()
    assert seen and all(ids == set(record.run["split"]["heldout_ids"]) for ids in seen)


def peak_at_six(step: int) -> float:
    return 0.6 - 0.04 * abs(step - 6)


def test_selection_follows_the_heldout_peak_while_the_pool_keeps_rising():
    cfg = small_config(heldout_every=3, max_steps=12, tasks_per_step=5, group_k=4)
    rig = make_rig(cfg, skill=rising, scores=peak_at_six)
    record = rig.loop.run()
    pool = record.pool_scores
    assert sum(pool[s] for s in (10, 11, 12)) > sum(pool[s] for s in (1, 2, 3)) + 1.0  # pool climbs
    assert record.heldout_scores == {s: pytest.approx(peak_at_six(s)) for s in (0, 3, 6, 9, 12)}
    assert record.selected_step == rig.loop.selected_step == 6
    assert record.selected["step"] == 6
    assert record.selected["heldout_score"] == pytest.approx(0.6)
    assert record.selected["baseline_heldout_score"] == pytest.approx(peak_at_six(0))

    summary = rig.loop.summary()
    json.dumps(summary)
    gap = summary["pool_heldout_gap"]
    assert set(gap) == {3, 6, 9, 12}  # step 0 has no pool score
    assert gap[12] == pytest.approx(pool[12] - peak_at_six(12))
    assert summary["max_pool_heldout_gap"] == max(gap.values())
    assert gap[12] > gap[6]  # the gap opens up after the held-out peak
    assert summary["selected_step"] == 6 and summary["stop_cause"] == "max_steps"
    assert summary["heldout_gain"] == pytest.approx(0.6 - peak_at_six(0))


def test_selected_json_on_disk_names_the_heldout_peak(tmp_path):
    rig = make_rig(small_config(heldout_every=3, max_steps=12), scores=peak_at_six, out_dir=tmp_path)
    rig.loop.run()
    selected = json.loads((tmp_path / "selected.json").read_text())
    assert selected["step"] == 6
    assert selected["heldout_score"] == pytest.approx(0.6)
    assert selected["baseline_heldout_score"] == pytest.approx(peak_at_six(0))
    assert selected["checkpoint"] == "checkpoints/step_000006"
    assert (tmp_path / selected["checkpoint"] / "loop_state.json").exists()


def test_ties_select_the_earliest_step():
    rig = make_rig(small_config(heldout_every=2, max_steps=8), scores={0: 0.2, 2: 0.5, 4: 0.5, 6: 0.4, 8: 0.5})
    record = rig.loop.run()
    assert record.selected_step == 2
    assert rig.loop.selected_heldout_score == 0.5


def test_baseline_wins_when_nothing_beats_it():
    record = make_rig(small_config(max_steps=6), scores=lambda s: 0.9 - 0.1 * s).loop.run()
    assert record.selected_step == 0


def test_patience_stops_after_n_evaluations_without_improvement():
    scores = {0: 0.1, 1: 0.2, 2: 0.3, 3: 0.4, 4: 0.4, 5: 0.35}  # a tie is not an improvement
    rig = make_rig(small_config(heldout_every=1, max_steps=20, heldout_patience=2), scores=scores)
    record = rig.loop.run()
    assert rig.evaluator.calls == [0, 1, 2, 3, 4, 5]
    assert len(rig.trainer.calls) == 5
    assert record.finished.data["stop_cause"] == "patience"
    assert rig.loop.summary()["stop_cause"] == "patience"
    assert record.selected_step == 3


def test_improvement_resets_patience():
    scores = {0: 0.1, 1: 0.0, 2: 0.2, 3: 0.1, 4: 0.3, 5: 0.2, 6: 0.4}  # 3 misses, never 2 in a row
    rig = make_rig(small_config(heldout_every=1, max_steps=6, heldout_patience=2), scores=scores)
    record = rig.loop.run()
    assert record.finished.data["stop_cause"] == "max_steps"
    assert len(rig.trainer.calls) == 6


@pytest.mark.parametrize("result, message", [(float("nan"), "non-finite"), (True, "got bool"),
                                             ("0.5", "got str")])
def test_bad_heldout_result_is_refused(result, message):
    rig = make_rig(small_config(max_steps=2), scores=lambda s: 0.5)
    rig.loop.heldout_eval = lambda step, tasks: result
    with pytest.raises(RLLoopError, match=message):
        rig.loop.run()


def test_same_seed_runs_are_byte_identical_once_timing_is_stripped(tmp_path):
    cfg = small_config(heldout_every=3, max_steps=8, checkpoint_every=2, keep_last=10)
    make_rig(cfg, scores=peak_at_six, out_dir=tmp_path / "a").loop.run()
    make_rig(cfg, scores=peak_at_six, out_dir=tmp_path / "b").loop.run()
    a, b = record_files(tmp_path / "a"), record_files(tmp_path / "b")
    assert "checkpoints/step_000004/loop_state.json" in a
    assert len(a["metrics.jsonl"]) == 8
    assert a == b


def test_strip_timing_is_what_makes_runs_comparable(tmp_path):
    # Guard for the test above: the raw event lines do differ (wall-clock), the stripped ones not.
    ticks = iter(range(10_000))
    cfg = small_config(max_steps=2)
    make_rig(cfg, out_dir=tmp_path / "a", clock=lambda: float(next(ticks))).loop.run()
    make_rig(cfg, out_dir=tmp_path / "b", clock=lambda: float(next(ticks))).loop.run()
    raw_a = (tmp_path / "a" / "events.jsonl").read_text()
    raw_b = (tmp_path / "b" / "events.jsonl").read_text()
    assert raw_a != raw_b
    assert record_files(tmp_path / "a")["events.jsonl"] == record_files(tmp_path / "b")["events.jsonl"]


def test_a_different_seed_changes_the_task_draw():
    a = make_rig(small_config(seed=0, max_steps=4)).loop.run()
    b = make_rig(small_config(seed=1, max_steps=4)).loop.run()
    c = make_rig(small_config(seed=0, max_steps=4)).loop.run()
    assert step_task_ids(a) == step_task_ids(c)
    assert step_task_ids(a) != step_task_ids(b)
    assert a.run["split"] == b.run["split"]  # the seed never moves the split


def test_group_relative_advantages_reach_the_trainer():
    rig = make_rig(small_config(max_steps=2, group_k=4, advantage="dr_grpo"))
    rig.loop.run()
    call = rig.trainer.calls[0]
    assert len(call.rollouts) == len(call.advantages) == 3 * 4
    for g in range(3):
        rewards = [r.reward for r in call.rollouts[4 * g: 4 * g + 4]]
        mu = sum(rewards) / 4
        assert call.advantages[4 * g: 4 * g + 4] == pytest.approx([r - mu for r in rewards])
    assert all(r.version == 0 for r in call.rollouts)


def test_loop_without_out_dir_keeps_the_record_in_memory():
    record = make_rig(small_config(max_steps=4, heldout_every=2)).loop.run()
    assert record.path is None
    checkpoints = [(e.step, e.data["path"]) for e in record.events if e.kind == "checkpoint"]
    assert checkpoints == [(0, None), (2, None), (4, None)]
    assert record.selected["checkpoint"] is None


@pytest.mark.parametrize("call", [
    lambda cfg, rows, **seams: RLLoop(cfg, exact_match, rows, **seams),  # the old keyword form
    lambda cfg, rows, **seams: RLLoop(cfg, exact_match, rows),  # the old positional form: a reward second
])
def test_the_old_reward_first_call_is_refused_naming_from_reward(call, rows):
    trainer = FakeTrainer()
    with pytest.raises(RLLoopError, match=r"RLLoop\.from_reward\(config, reward, bench"):
        call(small_config(), rows, sampler=FakeSampler(policy=trainer), trainer=trainer,
             heldout_eval=ScriptedEvaluator(lambda s: 0.5))


def test_seams_and_options_give_the_record_from_reward_gives(rows, tmp_path):
    # The thin constructor is the typed form spelled as keywords: both runs write the same record.
    def record(out, typed):
        trainer = FakeTrainer()
        sampler, evaluator = FakeSampler(policy=trainer), ScriptedEvaluator(lambda s: 0.1 * s)
        if typed:
            seams = LoopSeams({None: EnvPlan(exact_match, sampler=sampler)}, trainer, evaluator)
            loop = RLLoop(small_config(), rows, seams, LoopOptions(out_dir=out))
        else:
            loop = RLLoop.from_reward(small_config(), exact_match, rows, sampler=sampler, trainer=trainer,
                                      heldout_eval=evaluator, out_dir=out)
        loop.run()
        return record_files(out)

    assert record(tmp_path / "typed", True) == record(tmp_path / "keywords", False)


def test_a_loop_without_environments_is_refused(rows):
    with pytest.raises(RLLoopError, match="at least one environment"):
        RLLoop(small_config(), rows, LoopSeams({}, FakeTrainer(), ScriptedEvaluator(lambda s: 0.5)))
