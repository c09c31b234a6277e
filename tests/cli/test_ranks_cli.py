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
