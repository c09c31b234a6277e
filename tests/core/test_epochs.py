"""``loop.epochs``: the run stops once the training split has been seen N times (rows trained or
filtered), or at ``max_steps``, whichever comes first, says which, and resumes to the same end."""

from __future__ import annotations

import collections

from conftest import AbortAfter, make_rig, small_config
from rlvr.lr_schedule import schedule_horizon

# 40 rows, a quarter held out: 30 training rows, 3 a step.
TRAIN_ROWS, PER_STEP = 30, 3


def test_one_epoch_trains_every_training_row_once_then_stops_and_says_so(tmp_path):
    rig = make_rig(small_config(max_steps=50, epochs=1, tasks_per_step=PER_STEP, heldout_every=4), out_dir=tmp_path)
    record = rig.loop.run()
    assert record.finished.data["stop_cause"] == "epochs"
    assert rig.loop.step == TRAIN_ROWS // PER_STEP == schedule_horizon(50, 1, TRAIN_ROWS, PER_STEP)
    seen = collections.Counter(rig.trained_task_ids())
    assert len(seen) == TRAIN_ROWS and set(seen.values()) == {1}
    assert rig.loop.step in record.heldout_scores  # the last step is evaluated, as at max_steps
    assert record.metrics[-1]["data/epochs_seen"] == 1.0


def test_max_steps_ends_a_run_before_its_epochs():
    rig = make_rig(small_config(max_steps=4, epochs=3, tasks_per_step=PER_STEP))
    record = rig.loop.run()
    assert record.finished.data["stop_cause"] == "max_steps" and rig.loop.step == 4


def test_a_filtered_row_counts_as_seen():
    # At skill 0.5 with 3 samples a row, about a quarter of the groups are all right or all wrong and
    # filtered as zero-variance: those rows were seen too, and count towards the epochs.
    cfg = small_config(max_steps=50, epochs=2, tasks_per_step=PER_STEP, filter_zero_variance=True, group_k=3)
    rig = make_rig(cfg, skill=0.5)
    record = rig.loop.run()
    filtered = sum(len(e.data["filtered"]) for e in record.events if str(e.kind) == "step")
    assert record.finished.data["stop_cause"] == "epochs" and filtered > 0
    assert len(rig.trained_task_ids()) + filtered >= 2 * TRAIN_ROWS
    assert rig.loop.rows_seen == len(rig.trained_task_ids()) + filtered


def test_a_resumed_run_stops_at_the_same_epoch_end(tmp_path):
    cfg = small_config(max_steps=50, epochs=1, tasks_per_step=PER_STEP, heldout_every=3)
    full = make_rig(cfg, out_dir=tmp_path / "full")
    full.loop.run()
    first = make_rig(cfg, out_dir=tmp_path / "cut", should_abort=AbortAfter(4))
    assert first.loop.run().finished.data["stop_cause"] == "aborted"
    second = make_rig(cfg, out_dir=tmp_path / "cut")
    resumed = second.loop.run(resume=True)
    assert resumed.finished.data["stop_cause"] == "epochs" and second.loop.step == full.loop.step
    assert first.trained_task_ids() + second.trained_task_ids() == full.trained_task_ids()
