"""Damaged run folders: checkpoints checked against their manifest, record files rebuilt from a
checkpoint's own copy, and a full disk ending in one line and a state `resume` continues from."""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from conftest import AbortAfter, make_rig, small_config
from rlvr import RLLoopError, read_record
from rlvr.errors import RecordError, RecordWarning
from rlvr.record.checkpoints import MANIFEST, RECORD_DIR, require_sound
from rlvr.record.run_record import complete_checkpoints
from rlvr.record.sinks import SampleSchedule

CFG = dict(max_steps=12, heldout_every=3, tasks_per_step=4, group_k=3, keep_last=5)


def hump(step: int) -> float:
    return 0.5 - 0.03 * abs(step - 6)


def rig(out, **kw):
    return make_rig(small_config(**CFG), scores=hump, out_dir=out, samples=SampleSchedule(every=2), **kw)


@pytest.fixture(scope="module")
def full_run(tmp_path_factory):
    """An uninterrupted run: what every repaired run must end as."""
    out = tmp_path_factory.mktemp("full")
    return rig(out).loop.run()


def stopped_after(out: Path, steps: int = 8) -> Path:
    """A run stopped after ``steps`` steps (checkpoints at 0, 3, 6 and the stop)."""
    rig(out, should_abort=AbortAfter(steps)).loop.run()
    return out


def resume(out: Path):
    second = rig(out)
    return second, second.loop.run(resume=True)


def assert_like_full(record, full_run):
    assert record.heldout_scores == full_run.heldout_scores
    assert record.pool_scores == full_run.pool_scores
    assert [m["step"] for m in record.metrics] == list(range(1, 13))
    assert [e.step for e in record.events if e.kind == "step"] == list(range(1, 13))
    assert read_record(record.path).metrics == record.metrics


def flip_bytes(path: Path, at: int = 0, n: int = 4) -> None:
    data = bytearray(path.read_bytes())
    for i in range(at, min(at + n, len(data))):
        data[i] ^= 0xFF
    path.write_bytes(bytes(data))


def test_every_checkpoint_has_a_manifest_of_its_files_and_a_copy_of_the_record(tmp_path):
    out = stopped_after(tmp_path, 4)
    ckpt = out / "checkpoints" / "step_000003"
    manifest = json.loads((ckpt / MANIFEST).read_text())
    assert set(manifest["files"]) == {"trainer/fake_trainer.json", "loop_state.json", "record/run.json",
                                      "record/events.jsonl", "record/metrics.jsonl"}
    state = json.loads((ckpt / "loop_state.json").read_text())
    copied = (ckpt / RECORD_DIR / "events.jsonl").read_text().splitlines()
    assert len(copied) == state["record_offsets"]["events"]
    assert copied == (out / "events.jsonl").read_text().splitlines()[: len(copied)]


def test_flipped_bytes_in_the_newest_checkpoint_fall_back_to_the_one_before(tmp_path, full_run):
    out = stopped_after(tmp_path)
    newest = out / "checkpoints" / "step_000008"
    flip_bytes(newest / "trainer" / "fake_trainer.json", at=12, n=1)  # still valid JSON, another version
    with pytest.warns(RecordWarning, match=r"checkpoint step_000008 is damaged \(trainer/fake_trainer.json changed"):
        second, record = resume(out)
    assert [c.step for c in second.trainer.calls] == list(range(7, 13))  # from step 6, the newest good one
    assert (out / "checkpoints" / "step_000008.corrupt").is_dir() and not newest.exists()
    assert_like_full(record, full_run)
    warned = [e for e in record.events if e.kind == "warning" and "damaged" in e.data.get("reason", "")]
    assert len(warned) == 1 and warned[0].step == 6


@pytest.mark.parametrize("damage", ["truncate", "delete", "manifest", "state"])
def test_any_damage_to_a_checkpoint_is_caught_before_it_is_loaded(tmp_path, full_run, damage):
    out = stopped_after(tmp_path)
    newest = out / "checkpoints" / "step_000008"
    if damage == "truncate":
        path = newest / "record" / "metrics.jsonl"
        path.write_bytes(path.read_bytes()[:-10])
    elif damage == "delete":
        (newest / "trainer" / "fake_trainer.json").unlink()
    elif damage == "manifest":
        (newest / MANIFEST).write_text("{not json")
    else:
        (newest / "loop_state.json").write_text("{}")
    with pytest.warns(RecordWarning, match="step_000008 is damaged"):
        _, record = resume(out)
    assert_like_full(record, full_run)


def test_with_every_checkpoint_damaged_resume_refuses_naming_each(tmp_path):
    out = stopped_after(tmp_path, 4)
    for ckpt in (out / "checkpoints").glob("step_*"):
        flip_bytes(ckpt / "loop_state.json", at=5)
    with pytest.raises(RecordError, match=r"no usable checkpoint.*step_000004 is damaged.*step_000000 is damaged"):
        resume(out)
    # Every checkpoint set aside: still a run, never taken for an unfinished start that `rlvr train` clears.
    from rlvr.errors import UsageError
    from rlvr.record.run_folder import check_fresh_run_dir, unfinished_start

    (out / "config.json").write_text("{}")
    assert not unfinished_start(out)
    with pytest.raises(UsageError, match=r"checkpoints were all found damaged and set aside \(step_000000.corrupt"):
        check_fresh_run_dir(out)


def test_a_deleted_events_file_is_rebuilt_and_no_samples_are_lost(tmp_path, full_run):
    out = stopped_after(tmp_path)
    samples = sorted(p.name for p in (out / "samples").glob("step_*.jsonl"))
    assert samples
    (out / "events.jsonl").unlink()
    with pytest.warns(RecordWarning, match=r"events.jsonl did not hold the \d+ rows recorded at step_000008 "
                                           r"\(missing\); rebuilt"):
        _, record = resume(out)
    assert_like_full(record, full_run)
    kept = {p.name for p in (out / "samples").glob("step_*.jsonl")}
    assert set(samples) <= kept
    assert [str(e.kind) for e in record.events][:2] == ["start", "heldout"]


@pytest.mark.parametrize("damage", ["truncated", "torn_middle", "row_dropped"])
def test_a_damaged_metrics_file_is_rebuilt_from_the_checkpoint(tmp_path, full_run, damage):
    out = stopped_after(tmp_path)
    path = out / "metrics.jsonl"
    lines = path.read_text().splitlines(keepends=True)
    if damage == "truncated":
        path.write_text("".join(lines[:3]) + lines[3][:20])
    elif damage == "torn_middle":
        path.write_text("".join(lines[:2]) + lines[2][:15] + "".join(lines[3:]))
    else:
        path.write_text("".join(lines[:4] + lines[5:]))
    with pytest.warns(RecordWarning, match=r"metrics.jsonl did not hold the 8 rows recorded at step_000008"):
        _, record = resume(out)
    assert_like_full(record, full_run)
    assert [m["step"] for m in read_record(out).metrics] == list(range(1, 13))


def test_a_damaged_run_json_is_rebuilt_and_read_record_says_so_in_one_line(tmp_path, full_run):
    out = stopped_after(tmp_path)
    before = json.loads((out / "run.json").read_text())
    (out / "run.json").write_text('{"config": ')
    with pytest.raises(RecordError, match=r"run.json cannot be read \(JSONDecodeError"):
        read_record(out)
    with pytest.warns(RecordWarning, match=r"run.json cannot be read .*rebuilt from step_000008's copy"):
        _, record = resume(out)
    assert json.loads((out / "run.json").read_text()) == before
    assert_like_full(record, full_run)


def as_before_manifests(out: Path, *steps: int) -> None:
    """Checkpoints ``steps`` (default all) as rlvr wrote them before copies and manifests existed, in a
    run whose run.json, as then, does not record a checkpoint format."""
    run = json.loads((out / "run.json").read_text())
    del run["checkpoint_format"]
    (out / "run.json").write_text(json.dumps(run))
    for ckpt in (out / "checkpoints").glob("step_*"):
        if not steps or int(ckpt.name.removeprefix("step_")) in steps:
            shutil.rmtree(ckpt / RECORD_DIR)
            (ckpt / MANIFEST).unlink()


def test_a_checkpoint_without_a_copy_refuses_a_record_that_lost_rows(tmp_path):
    out = stopped_after(tmp_path)
    as_before_manifests(out)
    path = out / "metrics.jsonl"
    path.write_text("".join(path.read_text().splitlines(keepends=True)[:5]))
    with pytest.raises(RecordError, match=r"metrics.jsonl: 5 rows, but checkpoint step_000008 recorded 8 and keeps "
                                          r"no copy: the rows are lost"):
        resume(out)
    assert len(path.read_text().splitlines()) == 5  # nothing rewritten


def test_older_checkpoints_without_a_manifest_still_resume(tmp_path, full_run):
    out = stopped_after(tmp_path)
    as_before_manifests(out)
    _, record = resume(out)
    assert_like_full(record, full_run)


def test_a_checkpoint_that_lost_its_manifest_in_a_run_that_writes_them_is_set_aside(tmp_path, full_run):
    """The attack: delete the newest checkpoint's manifest and change its weights, so that it passes
    for one written before manifests. run.json records that this run writes a manifest every time."""
    out = stopped_after(tmp_path)
    newest = out / "checkpoints" / "step_000008"
    (newest / MANIFEST).unlink()
    flip_bytes(newest / "trainer" / "fake_trainer.json", at=12, n=1)
    with pytest.raises(RecordError, match=r"step_000008 is damaged \(its manifest.json is missing, and this run "
                                          r"writes one with every checkpoint\)"):
        require_sound(newest)  # what rlvr eval and rlvr export check before loading a step
    with pytest.warns(RecordWarning, match=r"checkpoint step_000008 is damaged \(its manifest.json is missing"):
        second, record = resume(out)
    assert [c.step for c in second.trainer.calls] == list(range(7, 13))  # from step 6, never the changed one
    assert (out / "checkpoints" / "step_000008.corrupt").is_dir()
    assert_like_full(record, full_run)
    warned = [e for e in record.events if e.kind == "warning" and "manifest.json is missing" in e.data["reason"]]
    assert len(warned) == 1


def test_a_manifest_on_an_earlier_checkpoint_says_the_later_ones_had_one(tmp_path, full_run):
    """A run whose run.json predates the record of the checkpoint format (or lost it): a checkpoint
    of an earlier step with a manifest is proof enough that this one was written with one too."""
    out = stopped_after(tmp_path)
    run = json.loads((out / "run.json").read_text())
    del run["checkpoint_format"]
    (out / "run.json").write_text(json.dumps(run))
    (out / "checkpoints" / "step_000008" / MANIFEST).unlink()
    with pytest.warns(RecordWarning, match=r"step_000008 is damaged \(its manifest.json is missing"):
        second, record = resume(out)
    assert [c.step for c in second.trainer.calls] == list(range(7, 13))
    assert_like_full(record, full_run)


def test_a_run_from_before_manifests_resumed_since_keeps_its_older_checkpoints(tmp_path, full_run):
    """Begun before manifests (steps 0 and 3 have none) and resumed by a version that writes them (6
    and 8 do): with 6 and 8 damaged, step 3 is loaded as it always was, not set aside."""
    out = stopped_after(tmp_path)
    as_before_manifests(out, 0, 3)
    for step in (6, 8):
        flip_bytes(out / "checkpoints" / f"step_{step:06d}" / "loop_state.json", at=5)
    with pytest.warns(RecordWarning, match=r"step_00000[68] is damaged") as warned:
        second, record = resume(out)
    assert sorted(str(w.message).split()[1] for w in warned) == ["step_000006", "step_000008"]
    assert [c.step for c in second.trainer.calls] == list(range(4, 13))  # from step 3, unchecked as before
    assert not (out / "checkpoints" / "step_000003.corrupt").exists()
    assert_like_full(record, full_run)


# ---- a full disk -------------------------------------------------------------------------------


def test_a_full_disk_at_any_write_ends_in_a_record_error_and_resumes_to_the_same_run(tmp_path, full_run,
                                                                                   monkeypatch):
    """fsync refusing with ENOSPC (as a full disk does) at the n-th durable write: JSON lines, the
    samples, run.json, selected.json, a checkpoint's files."""
    import rlvr.record.run_record as record_module

    real_fsync = os.fsync
    for n in (3, 9, 17, 30, 45):
        out = tmp_path / f"at_{n}"
        calls = {"n": 0}

        def fsync(fd, n=n, calls=calls):
            calls["n"] += 1
            if calls["n"] == n:
                raise OSError(errno.ENOSPC, "No space left on device")
            real_fsync(fd)

        monkeypatch.setattr(record_module.os, "fsync", fsync)
        with pytest.raises(RecordError, match=r"writing .* failed: No space left on device"):
            rig(out).loop.run()
        monkeypatch.setattr(record_module.os, "fsync", real_fsync)
        if not complete_checkpoints(out):  # stopped before step 0's checkpoint: nothing to resume, and it says so
            with pytest.raises(RLLoopError, match="never reached step 0|no complete checkpoint"):
                resume(out)
            continue
        _, record = resume(out)
        assert_like_full(record, full_run)


FULL_DISK_SCRIPT = textwrap.dedent("""
    import json, subprocess, sys
    sys.path[:0] = [{here!r}, {tests!r}, {src!r}]
    from rlvr.errors import RecordError
    def rig(out):
        from test_crash_safety import rig
        return rig(out)
    mnt, results = {mnt!r}, []
    for size in {sizes!r}:
        subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={{size}}k", "tmpfs", mnt], check=True)
        out = mnt + "/run"
        try:
            rig(out).loop.run()
            message = None
        except RecordError as exc:
            message = str(exc)
        subprocess.run(["mount", "-o", "remount,size=64m", mnt], check=True)
        resumed = None
        try:
            record = rig(out).loop.run(resume=True)
            resumed = [record.heldout_scores, record.pool_scores, [m["step"] for m in record.metrics]]
        except Exception as exc:
            resumed = repr(exc)
        results.append({{"size": size, "message": message, "resumed": json.loads(json.dumps(resumed))}})
        subprocess.run(["umount", mnt], check=True)
    print(json.dumps(results))
""")


def test_a_real_full_disk_ends_in_one_line_and_resumes(tmp_path, full_run):
    """A tmpfs of a few hundred KiB fills at whatever write comes next; made bigger, the run resumes."""
    if shutil.which("unshare") is None or subprocess.run(["unshare", "-rm", "true"], capture_output=True).returncode:
        pytest.skip("needs unshare -rm (user and mount namespaces) to mount a small tmpfs")
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    here = Path(__file__).parent
    script = FULL_DISK_SCRIPT.format(here=str(here), tests=str(here.parent), src=str(here.parent.parent / "src"),
                                     mnt=str(mnt),
                                     sizes=[72, 100, 130, 170, 220])
    done = subprocess.run(["unshare", "-rm", sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=120, cwd=here)
    assert done.returncode == 0, done.stderr[-2000:]
    results = json.loads(done.stdout.strip().splitlines()[-1])
    expected = [{str(k): v for k, v in full_run.heldout_scores.items()},
                {str(k): v for k, v in full_run.pool_scores.items()}, list(range(1, 13))]
    filled = [r for r in results if r["message"] is not None]
    assert len(filled) >= 3, results  # the disk filled at several points of the run
    for r in filled:
        assert "No space left on device" in r["message"] and "\n" not in r["message"], r
        if isinstance(r["resumed"], str) and ("never reached step 0" in r["resumed"]
                                              or "no complete checkpoint" in r["resumed"]):
            continue
        assert r["resumed"] == expected, r
