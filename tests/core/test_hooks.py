"""Progress/abort hooks: ambient binding, explicit precedence, and a clean abort."""

from __future__ import annotations

import threading

from conftest import AbortAfter, make_rig, small_config
from rlvr import current_rl_hooks, rl_hooks
from rlvr.types import Phase, Progress


def test_no_hooks_outside_a_block():
    assert current_rl_hooks() == (None, None)


def test_rl_hooks_binds_for_the_block_and_unbinds_after():
    progress, abort = (lambda p: None), (lambda: False)
    with rl_hooks(progress, abort) as bound:
        assert current_rl_hooks() == (progress, abort) == bound
        with rl_hooks(should_abort=abort):
            assert current_rl_hooks() == (None, abort)
        assert current_rl_hooks().progress_cb is progress
    assert current_rl_hooks() == (None, None)


def test_hooks_are_unbound_even_when_the_block_raises():
    try:
        with rl_hooks(lambda p: None, lambda: True):
            raise KeyError("boom")
    except KeyError:
        pass
    assert current_rl_hooks() == (None, None)


def test_hooks_do_not_leak_into_other_threads():
    seen = []
    with rl_hooks(lambda p: None, lambda: True):
        t = threading.Thread(target=lambda: seen.append(current_rl_hooks()))
        t.start()
        t.join()
    assert seen == [(None, None)]


def test_ambient_progress_cb_receives_every_phase():
    got: list[Progress] = []
    with rl_hooks(progress_cb=got.append):
        rig = make_rig(small_config(max_steps=3, heldout_every=3))
    rig.loop.run()
    phases = [(p.step, p.phase) for p in got]
    assert phases[0] == (0, Phase.HELDOUT)
    assert (1, Phase.SAMPLE) in phases and (3, Phase.TRAIN) in phases
    assert phases[-1] == (3, Phase.DONE)
    assert all(p.max_steps == 3 for p in got)
    last = got[-1]
    assert last.last_heldout == rig.loop.heldout_scores[3]


def test_explicit_progress_cb_wins_over_ambient():
    ambient, explicit = [], []
    with rl_hooks(progress_cb=ambient.append):
        rig = make_rig(small_config(max_steps=2), progress_cb=explicit.append)
        rig.loop.run()
    assert ambient == []
    assert len(explicit) > 0


def test_explicit_should_abort_wins_over_ambient():
    with rl_hooks(should_abort=lambda: True):
        rig = make_rig(small_config(max_steps=3), should_abort=lambda: False)
        record = rig.loop.run()
    assert record.finished.data["stop_cause"] == "max_steps"
    assert len(rig.trainer.calls) == 3


def test_ambient_abort_is_honoured_between_steps(tmp_path):
    abort = AbortAfter(4)
    with rl_hooks(should_abort=abort):
        rig = make_rig(small_config(max_steps=8, heldout_every=3), out_dir=tmp_path)
    record = rig.loop.run()
    assert [c.step for c in rig.trainer.calls] == [1, 2, 3, 4]
    # One sampler call per row: four trained batches, and the fifth that O = 0 samples while the
    # loop evaluates and checkpoints, which the record lists as unconsumed.
    per_step = rig.loop.config.tasks_per_step
    assert 4 * per_step <= rig.sampler.calls <= 5 * per_step
    assert len(record.finished.data["unconsumed_rows"]) == per_step
    assert abort.polls == 5  # polled before each step, never again once it fired
    aborted = [e for e in record.events if e.kind == "aborted"]
    assert [e.step for e in aborted] == [4]
    assert record.finished.data["stop_cause"] == "aborted"
    assert record.finished.step == 4
    kinds = [str(e.kind) for e in record.events]
    assert kinds[-2:] == ["selected", "finished"]
    assert kinds.index("aborted") > max(i for i, k in enumerate(kinds) if k == "step")
    assert (tmp_path / "checkpoints/step_000004/loop_state.json").exists()  # resumable from here


def test_explicit_abort_stops_before_the_first_step():
    rig = make_rig(small_config(max_steps=5), should_abort=lambda: True)
    record = rig.loop.run()
    # O = 0 starts sampling the first batch while step 0 is evaluated; the abort leaves it untrained
    # and the record says so.
    per_step = rig.loop.config.tasks_per_step
    assert rig.trainer.calls == [] and rig.sampler.calls <= per_step
    assert len(record.finished.data["unconsumed_rows"]) == per_step
    assert record.finished.data["stop_cause"] == "aborted"
    assert record.heldout_scores == {0: 0.1}
    assert rig.evaluator.calls == [0]
    assert record.selected_step == 0


def test_abort_after_the_last_step_does_not_mark_a_complete_run_aborted():
    rig = make_rig(small_config(max_steps=3), should_abort=AbortAfter(3))
    record = rig.loop.run()
    assert len(rig.trainer.calls) == 3 and rig.evaluator.calls[-1] == 3
    assert record.finished.data["stop_cause"] == "max_steps"
