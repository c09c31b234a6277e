"""``train.release_freed_memory``: freed CPU blocks go back to the system at once (backends/train/heap.py).

The mechanism, in fresh processes (malloc's state is per process): after glibc has raised its mmap
threshold (a 16 MiB block freed), 64 blocks of 4 MiB each come from the heap; freeing every other
one leaves all 256 MiB resident by default (each freed block lies between two live ones, so the heap
cannot shrink past it, wherever else the interpreter's own allocations fell), and only the live half
once the threshold is fixed. And the run config's key reaches the trainer and its record; unset, it is
on where ``micro_batch = "auto"`` sizes on CPU.
"""

from __future__ import annotations

import platform
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("torch")
pytest.importorskip("peft")

from rlvr.backends.train import heap  # noqa: E402

SCRIPT = textwrap.dedent("""
    import sys
    from pathlib import Path
    import torch

    def rss():
        return next(int(l.split()[1]) * 1024 for l in Path("/proc/self/status").read_text().splitlines()
                    if l.startswith("VmRSS:"))

    if sys.argv[1] == "release":
        from rlvr.backends.train.heap import release_freed_memory
        print(release_freed_memory())
    torch.ones(4 << 20).sum()  # a 16 MiB mapped block, freed: glibc now serves 4 MiB blocks from its heap
    start = rss()
    blocks = [torch.ones(1 << 20) for _ in range(64)]  # 4 MiB each
    peak = rss()
    del blocks[::2]  # the last block stays alive, and so does one beside each freed one
    print((peak - start) >> 20, (rss() - start) >> 20)
""")

glibc_only = pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="the lever acts on glibc's malloc")


def resident_after_free(mode: str) -> tuple[str, int, int]:
    out = subprocess.run([sys.executable, "-c", SCRIPT, mode], capture_output=True, text=True, check=True)
    *said, figures = out.stdout.strip().splitlines()
    grown, kept = map(int, figures.split())
    return " ".join(said), grown, kept


@glibc_only
def test_freed_blocks_stay_resident_by_default_and_go_back_with_the_lever():
    _, grown, kept = resident_after_free("default")
    assert grown >= 240 and kept >= grown - 16, (grown, kept)  # the heap keeps all it grew by
    said, grown, kept = resident_after_free("release")
    assert said == "glibc mmap threshold fixed at 128 KiB"
    assert grown >= 240 and kept <= grown // 2 + 16, (grown, kept)  # each freed 4 MiB block unmapped


def test_off_glibc_nothing_changes_and_it_says_so(monkeypatch):
    monkeypatch.setattr(platform, "libc_ver", lambda: ("", ""))
    assert heap.release_freed_memory().startswith("unchanged: not glibc")


def test_the_config_key_reaches_the_trainer_and_its_record_and_auto_sizing_turns_it_on(tmp_path, monkeypatch):
    from rlvr.backends.model.policy import Policy
    from rlvr.backends.model.tiny import build_tiny_model
    from rlvr.config.run import run_config_from_dict
    from rlvr.wiring.trainer import make_trainer

    calls = []
    monkeypatch.setattr(heap, "release_freed_memory", lambda: calls.append(1) or "fixed (test)")
    policy = Policy(str(build_tiny_model(tmp_path / "base", hidden=32, layers=2, heads=2, seed=0)),
                    need_reference=False)
    off = make_trainer(run_config_from_dict({}), policy)
    assert off.describe()["heap"] == "default" and not calls
    on = make_trainer(run_config_from_dict({"train": {"release_freed_memory": True}}), policy)
    assert on.describe()["heap"] == "fixed (test)" and calls == [1]
    unset = make_trainer(run_config_from_dict({"train": {"micro_batch": "auto"}}), policy)
    assert unset.describe()["heap"] == "fixed (test)" and calls == [1, 1]  # "auto" on CPU: its estimate holds
    kept = make_trainer(run_config_from_dict({"train": {"micro_batch": "auto", "release_freed_memory": False}}),
                        policy)
    assert kept.describe()["heap"] == "default" and calls == [1, 1]
