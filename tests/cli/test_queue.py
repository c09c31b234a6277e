"""The run queue's bookkeeping without training: ids, the lock, the budget, recovery after a dead drainer."""

from __future__ import annotations

import fcntl
import json

from rlvr.cli.queue import EXIT_BUSY, Queue, _today, drain, recover
from rlvr.run.record import STATE_FILE


def test_entries_get_increasing_ids_and_are_listed_in_order(tmp_path):
    q = Queue(tmp_path / "q")
    ids = [q.add(None, str(tmp_path / f"r{i}"), [f"--loop.seed={i}"])["id"] for i in range(3)]
    assert ids == [1, 2, 3]
    assert [e["overrides"] for e in q.entries()] == [["--loop.seed=0"], ["--loop.seed=1"], ["--loop.seed=2"]]
    assert all(e["state"] == "queued" for e in q.entries())


def test_a_second_drainer_exits_at_once(tmp_path):
    q = Queue(tmp_path / "q")
    q.ensure()
    with open(q.root / "lock", "a+") as held:
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        held.write("pid 1 since now")
        held.flush()
        said = []
        assert drain(q, None, None, log=said.append) == EXIT_BUSY
    assert "being drained by pid 1" in said[0]


def test_the_budget_stops_the_drain_before_a_run_starts(tmp_path):
    q = Queue(tmp_path / "q")
    q.add(None, str(tmp_path / "r"), [])
    q.spend(_today(), 7200.0)
    said = []
    assert drain(q, None, 2.0, log=said.append) == 0
    assert "budget reached: 2.00 h" in said[-1] and q.entries()[0]["state"] == "queued"


def test_an_entry_left_running_by_a_dead_drainer_is_resumed_or_failed(tmp_path):
    q = Queue(tmp_path / "q")
    with_ckpt, without = tmp_path / "a", tmp_path / "b"
    (with_ckpt / "checkpoints" / "step_000002").mkdir(parents=True)
    (with_ckpt / "checkpoints" / "step_000002" / STATE_FILE).write_text("{}")
    (with_ckpt / "run.json").write_text("{}")
    without.mkdir()
    for out in (with_ckpt, without):
        entry = q.add(None, str(out), [])
        entry.update(state="running", attempts=1, child_pid=2**22 + 7, drainer_pid=2**22 + 8)
        q.save(entry)
    recover(q, log=lambda _m: None)
    first, second = q.entries()
    assert (first["state"], first["resume"]) == ("queued", True)
    assert second["state"] == "failed" and "first checkpoint" in second["note"]
    assert json.loads((q.entries_dir / "000001.json").read_text())["resume"] is True
