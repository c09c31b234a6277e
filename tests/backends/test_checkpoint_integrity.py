"""The torch trainer's checkpoints under damage: flipped bytes in the weights and a corrupt optimizer
state are caught before they load (a resume takes the checkpoint before), even with the manifest
deleted, and a full disk during a save is an ``OSError`` with its cause, not torch's "unexpected pos"."""

from __future__ import annotations

import errno
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from conftest import AbortAfter, small_config
from rlvr import RLLoop
from rlvr.errors import RecordError, RecordWarning
from rlvr.record.checkpoints import manifest_fault, require_sound
from rlvr.testing import ScriptedEvaluator, exact_match, make_rows

torch = pytest.importorskip("torch")
pytest.importorskip("peft")


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    from rlvr.backends.model.tiny import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "base", hidden=32, layers=2, heads=2, seed=0)


def torch_loop(base: Path, out: Path, lora: bool, **kw) -> RLLoop:
    from rlvr.backends.model.policy import LoraSpec, Policy
    from rlvr.backends.sample.batched import TransformersSampler
    from rlvr.backends.train.trainer import TorchTrainer

    policy = Policy(str(base), lora=LoraSpec(rank=4, alpha=8.0) if lora else None, need_reference=False, seed=0)
    cfg = small_config(max_steps=4, heldout_every=2, tasks_per_step=2, group_k=2, keep_last=5)
    return RLLoop.from_reward(cfg, exact_match, make_rows(40),
                              sampler=TransformersSampler(policy, max_new_tokens=3, seed=0),
                              trainer=TorchTrainer(policy, lr=1e-2),
                              heldout_eval=ScriptedEvaluator(lambda s: 0.1 + 0.01 * s), out_dir=out, **kw)


def flip(path: Path, at: int, n: int = 64) -> None:
    data = bytearray(path.read_bytes())
    for i in range(at, at + n):
        data[i] ^= 0x5A
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("lora, damaged", [(False, "trainer/weights.safetensors"),
                                           (True, "trainer/adapter/adapter_model.safetensors"),
                                           (False, "trainer/optimizer.pt")])
def test_damaged_weights_or_optimizer_state_fall_back_to_the_checkpoint_before(base, tmp_path, lora, damaged):
    out = tmp_path / "run"
    torch_loop(base, out, lora, should_abort=AbortAfter(3)).run()  # checkpoints 0, 2 and 3
    newest = out / "checkpoints" / "step_000003"
    target = newest / damaged
    flip(target, at=target.stat().st_size // 2)  # tensor bytes: every loader takes them as they are
    assert "changed since it was written" in manifest_fault(newest)
    with pytest.raises(RecordError, match="step_000003 is damaged"):
        require_sound(newest)  # what rlvr eval and rlvr export check before loading a step
    resumed = torch_loop(base, out, lora)
    with pytest.warns(RecordWarning, match=rf"step_000003 is damaged \({damaged} changed"):
        record = resumed.run(resume=True)
    assert [e.step for e in record.events if e.kind == "resumed"] == [2]
    assert [m["step"] for m in record.metrics] == [1, 2, 3, 4]
    assert (out / "checkpoints" / "step_000003.corrupt").is_dir()


def test_flipped_adapter_bytes_with_the_manifest_deleted_are_not_taken_for_an_old_checkpoint(base, tmp_path):
    """Deleting the manifest once made a checkpoint pass for one written before manifests, loaded unchecked."""
    out = tmp_path / "run"
    torch_loop(base, out, True, should_abort=AbortAfter(3)).run()
    newest = out / "checkpoints" / "step_000003"
    target = newest / "trainer" / "adapter" / "adapter_model.safetensors"
    flip(target, at=target.stat().st_size // 2)
    (newest / "manifest.json").unlink()
    with pytest.raises(RecordError, match=r"step_000003 is damaged \(its manifest.json is missing"):
        require_sound(newest)
    with pytest.warns(RecordWarning, match=r"step_000003 is damaged \(its manifest.json is missing, and this run "
                                           r"writes one with every checkpoint\)"):
        record = torch_loop(base, out, True).run(resume=True)
    assert [e.step for e in record.events if e.kind == "resumed"] == [2]
    assert (out / "checkpoints" / "step_000003.corrupt").is_dir()


FULL_DISK = textwrap.dedent("""
    import subprocess, sys, torch
    sys.path.insert(0, {src!r})
    from rlvr.backends.train.checkpoint_io import write_checkpoint
    mnt = {mnt!r}
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", mnt], check=True)
    model = torch.nn.Linear(256, 256)
    opt = torch.optim.AdamW(model.parameters())
    model(torch.randn(2, 256)).sum().backward()
    opt.step()
    try:
        write_checkpoint(__import__("pathlib").Path(mnt) / "ckpt", model, opt.state_dict(), {{"version": 1}})
    except OSError as exc:
        print("OSError", exc.errno, exc.strerror)
""")


def test_a_write_torch_fails_is_an_os_error_naming_the_folder_and_free_space(tmp_path, monkeypatch):
    """torch's zip writer reports a full disk as a bare RuntimeError ("unexpected pos"), as it does on a
    filled tmpfs (the slow test below); here it is made to, since /dev/full does not fail it reliably."""
    from rlvr.backends.train import trainer as trainer_module

    def full(*_args, **_kwargs):
        raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 704 vs 598")

    monkeypatch.setattr(trainer_module.torch, "save", full)
    root = tmp_path / "ckpt"
    model = torch.nn.Linear(8, 8)
    with pytest.raises(OSError) as caught:
        trainer_module.write_checkpoint(root, model, torch.optim.AdamW(model.parameters()).state_dict(),
                                        {"version": 1})
    assert caught.value.filename == str(root)
    assert caught.value.strerror.startswith("RuntimeError: ") and "MiB free on its disk" in caught.value.strerror


@pytest.mark.slow
def test_a_full_disk_during_a_save_is_an_os_error_with_its_cause(tmp_path):
    if shutil.which("unshare") is None or subprocess.run(["unshare", "-rm", "true"], capture_output=True).returncode:
        pytest.skip("needs unshare -rm (user and mount namespaces) to mount a small tmpfs")
    (tmp_path / "mnt").mkdir()
    src = str(Path(__file__).parents[2] / "src")
    script = FULL_DISK.format(src=src, mnt=str(tmp_path / "mnt"))
    done = subprocess.run(["unshare", "-rm", sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    kind, code, *message = done.stdout.strip().splitlines()[-1].split(" ", 2)
    assert kind == "OSError" and int(code) == errno.ENOSPC, done.stdout
    assert "No space left on device" in message[0] and "MiB free on its disk" in message[0]
