"""What was started for a run (its ``closers``: engines, servers, proxies, workers) is stopped when
``run()`` returns or raises, each once, in reverse order of starting, so a process that goes on (a
notebook, a test session, a queue) keeps no finished run's servers; a closer that fails is reported
and the others still stop."""

from __future__ import annotations

import pytest

from conftest import make_rig, small_config
from rlvr.testing import FakeTrainer


def test_a_finished_run_stops_what_was_started_for_it_once_in_reverse_order(tmp_path):
    stopped: list[str] = []
    rig = make_rig(small_config(max_steps=2), out_dir=tmp_path,
                   closers=[lambda: stopped.append("server"), lambda: stopped.append("proxy")])
    record = rig.loop.run()
    assert record.finished is not None and stopped == ["proxy", "server"]
    rig.loop.close()  # a second close (atexit's, or the caller's) stops nothing again
    assert stopped == ["proxy", "server"]


class Exploding(FakeTrainer):
    def __call__(self, batch):
        raise RuntimeError("the trainer fell over")


def test_a_failed_run_stops_them_too_and_a_failing_closer_is_reported(tmp_path):
    stopped: list[str] = []
    said: list[str] = []

    def broken() -> None:
        raise OSError("already gone")

    rig = make_rig(small_config(max_steps=2), out_dir=tmp_path, log=said.append,
                   closers=[lambda: stopped.append("server"), broken])
    rig.loop.trainer = Exploding()
    with pytest.raises(RuntimeError, match="fell over"):
        rig.loop.run()
    assert stopped == ["server"]
    assert any("failed: OSError: already gone" in line for line in said), said
