"""Resume: an interrupted run, continued with fresh seams, ends where an uninterrupted one does."""

from __future__ import annotations

import json

import pytest

from conftest import AbortAfter, make_rig, record_files, small_config, step_task_ids
from rlvr import RLLoopError, read_record
from rlvr.errors import RecordError
from rlvr.testing import FakeSampler, FakeTrainer, make_rows


def hump(step: int) -> float:
    return 0.5 - 0.03 * abs(step - 6)


CFG = dict(max_steps=11, heldout_every=3, tasks_per_step=4, group_k=3)


class CrashingTrainer(FakeTrainer):
    """A trainer that dies (like an OOM) when asked for step ``at``."""

    def __init__(self, at: int):
        super().__init__()
        self.at = at

    def __call__(self, batch):
        if batch.step == self.at:
            raise MemoryError(f"simulated crash at step {batch.step}")
        return super().__call__(batch)


def interrupted_then_resumed(tmp_path, sampler_cls, abort_at=4):
    cfg = small_config(**CFG)
    first = make_rig(cfg, scores=hump, sampler_cls=sampler_cls, out_dir=tmp_path,
                     should_abort=AbortAfter(abort_at))
    aborted = first.loop.run()
    assert aborted.finished.data["stop_cause"] == "aborted"
    second = make_rig(cfg, scores=hump, sampler_cls=sampler_cls, out_dir=tmp_path)  # fresh seams
    record = second.loop.run(resume=True)
    return first, second, record


def uninterrupted(tmp_path, sampler_cls):
    rig = make_rig(small_config(**CFG), scores=hump, sampler_cls=sampler_cls, out_dir=tmp_path)
    return rig, rig.loop.run()


def assert_same_outcome(full_rig, full, first, second, resumed):
    assert resumed.heldout_scores == full.heldout_scores
    assert resumed.pool_scores == full.pool_scores
    assert resumed.selected_step == full.selected_step == 6
    assert second.loop.summary()["selected_step"] == 6
    assert first.trained_task_ids() + second.trained_task_ids() == full_rig.trained_task_ids()
    assert [c.step for c in first.trainer.calls + second.trainer.calls] == list(range(1, 12))


def test_abort_then_resume_matches_an_uninterrupted_run(tmp_path):
    # Sampler draws keyed on the policy version, so fresh seams can redraw what the first run drew.
    full_rig, full = uninterrupted(tmp_path / "full", FakeSampler)
    first, second, resumed = interrupted_then_resumed(tmp_path / "cut", FakeSampler, abort_at=4)
    assert [c.step for c in first.trainer.calls] == [1, 2, 3, 4]  # 4 is not a checkpoint boundary
    assert_same_outcome(full_rig, full, first, second, resumed)
    assert step_task_ids(resumed) == step_task_ids(full)
    assert read_back_equal(tmp_path / "cut", resumed)
    kinds = [str(e.kind) for e in resumed.events]
    assert kinds.count("finished") == 1 and kinds.count("resumed") == 1
    assert resumed.finished.data["stop_cause"] == "max_steps"


def test_abort_then_resume_with_plain_fake_sampler_matches_an_uninterrupted_run(tmp_path):
    full_rig, full = uninterrupted(tmp_path / "full", FakeSampler)
    first, second, resumed = interrupted_then_resumed(tmp_path / "cut", FakeSampler, abort_at=4)
    assert_same_outcome(full_rig, full, first, second, resumed)


def read_back_equal(out_dir, record) -> bool:
    loaded = read_record(out_dir)
    return (loaded.heldout_scores, loaded.pool_scores, loaded.selected_step, loaded.events) == (
        record.heldout_scores, record.pool_scores, record.selected_step, record.events)


def test_resume_after_a_crash_redoes_the_lost_steps_once(tmp_path):
    full_rig, full = uninterrupted(tmp_path / "full", FakeSampler)
    cfg = small_config(**CFG)
    first = make_rig(cfg, scores=hump, sampler_cls=FakeSampler, out_dir=tmp_path / "cut")
    first.trainer = first.loop.trainer = CrashingTrainer(at=5)
    first.sampler.policy = first.trainer
    with pytest.raises(MemoryError):
        first.loop.run()
    assert [c.step for c in first.trainer.calls] == [1, 2, 3, 4]  # last checkpoint: step 3
    second = make_rig(cfg, scores=hump, sampler_cls=FakeSampler, out_dir=tmp_path / "cut")
    resumed = second.loop.run(resume=True)
    assert [c.step for c in second.trainer.calls] == list(range(4, 12))  # step 4 is redone
    assert resumed.pool_scores == full.pool_scores
    assert resumed.heldout_scores == full.heldout_scores
    assert [e.step for e in resumed.events if e.kind == "step"] == list(range(1, 12))  # no duplicates
    assert [m["step"] for m in resumed.metrics] == list(range(1, 12))
    assert step_task_ids(resumed) == step_task_ids(full)
    assert read_back_equal(tmp_path / "cut", resumed)


def test_resume_refuses_a_corpus_that_gives_another_split(tmp_path):
    cfg = small_config(max_steps=4)
    make_rig(cfg, out_dir=tmp_path, should_abort=AbortAfter(2)).loop.run()
    other = make_rig(cfg, rows=make_rows(40, seed=1), out_dir=tmp_path)
    with pytest.raises(RLLoopError, match="does not give the split"):
        other.loop.run(resume=True)
    assert other.trainer.calls == []


def test_resume_needs_an_out_dir():
    with pytest.raises(RLLoopError, match="resume needs out_dir"):
        make_rig(small_config()).loop.run(resume=True)


def test_checkpoints_beyond_keep_last_are_pruned_but_the_best_is_kept(tmp_path):
    cfg = small_config(max_steps=10, heldout_every=1, keep_last=2)
    rig = make_rig(cfg, scores=lambda s: 0.9 if s == 2 else 0.1 + 0.01 * s, out_dir=tmp_path)
    record = rig.loop.run()
    assert record.selected_step == 2
    kept = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())
    assert kept == ["step_000002", "step_000009", "step_000010"]
    assert json.loads((tmp_path / "checkpoints/step_000002/loop_state.json").read_text())["step"] == 2
    assert (tmp_path / "checkpoints/step_000002/trainer/fake_trainer.json").exists()
    events = [e for e in record.events if e.kind == "checkpoint"]
    assert [e.step for e in events] == list(range(0, 11))
    assert [e.data["parent"] for e in events] == [None, *range(0, 10)]


def test_checkpoint_state_carries_what_a_resume_needs(tmp_path):
    make_rig(small_config(max_steps=6, heldout_every=3), out_dir=tmp_path).loop.run()
    state = json.loads((tmp_path / "checkpoints/step_000003/loop_state.json").read_text())
    assert state["step"] == state["version"] == 3 and state["parent"] == 0
    # Rows of step 4 are already admitted (sampled while step 3 is evaluated): the checkpoint lists
    # them as pending, for a resume to sample first, and the cursor continues after them.
    per_step = small_config().tasks_per_step
    assert state["cursor"] == {"epoch": 0, "position": 4 * per_step}
    assert len(state["pending"]) == per_step
    assert set(state["gate"]["scores"]) == {"0", "3"}
    assert state["record_offsets"]["metrics"] == 3
    assert state["seed"] == 0 and state["stop_cause"] is None


def test_selected_checkpoint_exists_when_heldout_and_checkpoint_periods_differ(tmp_path):
    cfg = small_config(max_steps=8, heldout_every=3, checkpoint_every=2)
    record = make_rig(cfg, scores={0: 0.1, 3: 0.5, 6: 0.4, 8: 0.3}, out_dir=tmp_path).loop.run()
    assert record.selected_step == 3
    assert (tmp_path / record.selected["checkpoint"] / "loop_state.json").exists()


def test_record_files_of_a_resumed_run_keep_one_line_per_step(tmp_path):
    interrupted_then_resumed(tmp_path, FakeSampler, abort_at=5)
    files = record_files(tmp_path)
    assert [json.loads(m)["step"] for m in files["metrics.jsonl"]] == list(range(1, 12))


def test_abort_on_a_checkpoint_boundary_keeps_checkpoint_lineage(tmp_path):
    rig = make_rig(small_config(max_steps=6, heldout_every=3), out_dir=tmp_path, should_abort=AbortAfter(3))
    record = rig.loop.run()
    assert record.finished.data["stop_cause"] == "aborted"
    checkpoints = [(e.step, e.data["parent"]) for e in record.events if e.kind == "checkpoint"]
    assert all(parent is None or parent < step for step, parent in checkpoints)
    state = json.loads((tmp_path / "checkpoints/step_000003/loop_state.json").read_text())
    assert state["parent"] == 0


def test_resume_of_a_run_that_never_started_says_so(tmp_path):
    rig = make_rig(small_config(), out_dir=tmp_path)
    with pytest.raises(RLLoopError, match="never reached step 0"):
        rig.loop.run(resume=True)
    assert rig.sampler.calls == 0 and rig.trainer.calls == []


class SaveCrashingTrainer(FakeTrainer):
    """Dies while writing the checkpoint of step ``at`` (after its held-out score is known)."""

    def __init__(self, at: int):
        super().__init__()
        self.at = at

    def save(self, path):
        if self.version == self.at:
            raise OSError("disk full")
        super().save(path)


def test_selected_json_never_names_a_checkpoint_that_is_not_on_disk(tmp_path):
    cfg = small_config(max_steps=6, heldout_every=2)
    trainer = SaveCrashingTrainer(at=4)
    rig = make_rig(cfg, scores=lambda s: s / 10, out_dir=tmp_path, trainer=trainer,
                   sampler=FakeSampler(policy=trainer))
    with pytest.raises(RecordError, match=r"step_000004 failed: disk full; the last complete one is step 2"):
        rig.loop.run()
    selected = json.loads((tmp_path / "selected.json").read_text())
    assert selected["step"] == 2 and (tmp_path / selected["checkpoint"] / "loop_state.json").exists()


def test_resume_refuses_a_different_config(tmp_path):
    first = make_rig(small_config(**CFG), out_dir=tmp_path, should_abort=AbortAfter(4))
    first.loop.run()
    other = make_rig(small_config(**{**CFG, "tasks_per_step": 2, "seed": 7}), out_dir=tmp_path)
    with pytest.raises(RLLoopError, match=r"differ: \['seed', 'tasks_per_step'\]"):
        other.loop.run(resume=True)
    longer = make_rig(small_config(**{**CFG, "max_steps": CFG["max_steps"] + 2}), out_dir=tmp_path)
    assert longer.loop.run(resume=True).finished.step == CFG["max_steps"] + 2


def test_a_run_recorded_before_a_loop_key_existed_resumes_with_that_keys_default(tmp_path):
    first = make_rig(small_config(**CFG), out_dir=tmp_path, should_abort=AbortAfter(4))
    first.loop.run()
    run_json = tmp_path / "run.json"
    info = json.loads(run_json.read_text())
    del info["config"]["heldout_max_rows"]  # as written by an rlvr that did not know the key yet
    run_json.write_text(json.dumps(info))
    resumed = make_rig(small_config(**CFG), out_dir=tmp_path).loop.run(resume=True)
    assert resumed.finished.step == CFG["max_steps"]
    changed = make_rig(small_config(**{**CFG, "heldout_max_rows": 7}), out_dir=tmp_path)
    with pytest.raises(RLLoopError, match=r"differ: \['heldout_max_rows'\]"):
        changed.loop.run(resume=True)
