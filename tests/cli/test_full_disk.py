"""A full disk under the CLI: whichever write the disk refuses (torch's checkpoint writer, a record
line), `rlvr train` ends in one ``rlvr: error:`` line naming the file and the cause, with no
traceback, and `rlvr resume` continues to the end of the run. The writers are made to fail the way
each fails on a real full disk (a small tmpfs is not mountable everywhere tests run)."""

from __future__ import annotations

import errno
import os

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("peft")

from rlvr import read_record  # noqa: E402
from rlvr.cli.commands import main  # noqa: E402

pytestmark = pytest.mark.train

CONFIG = """
[loop]
max_steps = 3
tasks_per_step = 2
group_k = 2
heldout_every = 1
corpus_min = 20
heldout_frac = 0.2
lora_rank = 0

[model]
hidden = 16
layers = 1
heads = 2
threads = 1

[task]
name = "addition"
n = 40

[sft]
steps = 0

[sampler]
max_new_tokens = 2
"""


# How each writer fails on a full disk: torch's zip writer with its own RuntimeError and no cause,
# safetensors with its errno in the text, Python's own writes (the record) with an OSError.
TORCH_FULL = RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 704 vs 598")
SAFETENSORS_FULL = "Error while serializing: I/O error: No space left on device (os error 28)"


def refuse_at(n: int, real, failure):
    """``real`` until its ``n``-th call, which raises ``failure()`` as a full disk makes it."""
    calls = {"n": 0}

    def write(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == n:
            raise failure()
        return real(*args, **kwargs)

    return write


def full_disk_at(where: str, monkeypatch) -> str:
    """Make the write ``where`` fail as on a full disk; what the one line must say."""
    from safetensors import SafetensorError

    import rlvr.backends.train.checkpoint_io as checkpoint_io
    import rlvr.record.run_record as record_module

    if where == "optimizer_state":  # the checkpoint of step 2 (torch.save's third call)
        monkeypatch.setattr(torch, "save", refuse_at(3, torch.save, lambda: TORCH_FULL))
        return "MiB free on its disk"
    if where == "weights":  # the checkpoint of step 1
        monkeypatch.setattr(checkpoint_io, "save_model",
                            refuse_at(2, checkpoint_io.save_model, lambda: SafetensorError(SAFETENSORS_FULL)))
        return "No space left on device"
    # a durable write of the record, some way into the run
    monkeypatch.setattr(record_module.os, "fsync",
                        refuse_at(41, os.fsync, lambda: OSError(errno.ENOSPC, "No space left on device")))
    return "No space left on device"


@pytest.mark.parametrize("where", ["optimizer_state", "weights", "record_line"])
def test_a_full_disk_under_rlvr_train_is_one_line_and_rlvr_resume_finishes(tmp_path, capsys, monkeypatch, where):
    config = tmp_path / "run.toml"
    config.write_text(CONFIG)
    out = tmp_path / "run"
    said = full_disk_at(where, monkeypatch)
    assert main(["train", str(config), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("rlvr: error:")]
    assert len(errors) == 1 and said in errors[0] and "checkpoint" in errors[0] + err, err
    assert "Traceback" not in err
    assert f"rlvr resume {out}" in err  # where it picks up
    monkeypatch.undo()
    assert main(["resume", str(out)]) == 0
    record = read_record(out)
    assert [m["step"] for m in record.metrics] == [1, 2, 3]
    assert record.finished is not None and record.finished.data["stop_cause"] == "max_steps"
