"""Gains read "points" only for rewards in [0, 1]: a length penalty going from -46.55 to -45.67 is
+0.880, never "+88.0 points"; in the summary, the CLI's last lines and the report."""

from __future__ import annotations

from pathlib import Path

from conftest import make_rig, small_config
from rlvr import RLLoop
from rlvr.cli.commands import summary_lines
from rlvr.record.gain import change_text, in_unit_interval, observed_in_unit_interval
from rlvr.testing import FakeSampler, FakeTrainer, ScriptedEvaluator, exact_match, make_rows


def test_points_only_inside_the_unit_interval():
    assert change_text(0.25, 0.5, unit_interval=True) == "+25.0 points"
    assert change_text(-46.55, -45.67, unit_interval=False) == "+0.880"
    assert in_unit_interval([0.0, 1.0, None]) and not in_unit_interval([1.5]) and not in_unit_interval([float("nan")])


def test_the_range_is_every_sample_and_every_score_the_run_saw():
    metrics = [{"step": 1, "rollout/reward_min": 0.0, "rollout/reward_max": 1.0}]
    assert observed_in_unit_interval(metrics, {0: 0.5})
    assert not observed_in_unit_interval([*metrics, {"step": 2, "rollout/reward_min": -3.0}], {0: 0.5})
    assert not observed_in_unit_interval(metrics, {0: 0.5}, {3: 2.0})


def negative(messages, answer):
    return exact_match(messages, answer) - 47.0  # rewards in [-47, -46]


def test_a_run_of_negative_rewards_says_its_gain_as_a_change():
    trainer = FakeTrainer()
    loop = RLLoop.from_reward(small_config(max_steps=3, heldout_every=3), negative, make_rows(40),
                              sampler=FakeSampler(0.5, policy=trainer), trainer=trainer,
                              heldout_eval=ScriptedEvaluator({0: -46.55, 3: -45.67}))
    summary = loop.run().summary
    assert summary["rewards_in_unit_interval"] is False
    lines = summary_lines(summary, Path("runs/x"))
    assert "(+0.880)" in lines[1] and "points" not in " ".join(lines)


def test_a_run_of_rewards_in_the_unit_interval_says_points():
    record = make_rig(small_config(max_steps=3, heldout_every=3), scores={0: 0.25, 3: 0.5}).loop.run()
    assert record.summary["rewards_in_unit_interval"] is True
    assert "(+25.0 points)" in summary_lines(record.summary, Path("runs/x"))[1]


def test_the_report_says_the_same_and_shows_the_like_for_like_gap(tmp_path):
    from rlvr.record.report import summary_rows
    from rlvr.record.run_record import read_record

    trainer = FakeTrainer()
    RLLoop.from_reward(small_config(max_steps=3, heldout_every=3, train_eval=True), negative, make_rows(40),
                       sampler=FakeSampler(0.5, policy=trainer), trainer=trainer,
                       heldout_eval=ScriptedEvaluator({0: -46.55, 3: -45.67}), out_dir=tmp_path).run()
    rows = dict(summary_rows(read_record(tmp_path)))
    assert "gain +0.880 over step 0" in rows["selected"] and "points" not in rows["selected"]
    assert rows["training rows vs held-out"].startswith("+0.000 at step 3")  # the scripted evaluator: same score
