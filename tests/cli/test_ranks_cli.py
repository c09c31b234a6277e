"""``--nproc``: refused with a clear message where it cannot mean anything, before torchrun starts."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

from rlvr.cli.commands import main  # noqa: E402


def test_nproc_below_one_is_refused(tmp_path, capsys):
    assert main(["train", "--out", str(tmp_path / "run"), "--nproc", "0"]) == 2
    assert "--nproc 0: give the number of trainer ranks" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


def test_nproc_inside_torchrun_is_refused(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert main(["train", "--out", str(tmp_path / "run"), "--nproc", "2"]) == 2
    assert "torchrun already started the ranks" in capsys.readouterr().err


def test_a_run_stopped_on_request_keeps_its_exit_status_through_torchrun(tmp_path):
    from conftest import make_rig, small_config
    from rlvr.cli.commands import EXIT_STOPPED, _ranks_exit

    calls = iter([False, True])
    make_rig(small_config(max_steps=4), out_dir=tmp_path / "stopped", should_abort=lambda: next(calls, True)).loop.run()
    make_rig(small_config(max_steps=2), out_dir=tmp_path / "done").loop.run()
    assert _ranks_exit(1, tmp_path / "stopped") == EXIT_STOPPED  # torchrun says 1 for any failed rank
    assert _ranks_exit(1, tmp_path / "done") == 1 and _ranks_exit(0, tmp_path / "done") == 0
    assert _ranks_exit(1, tmp_path / "never-started") == 1
