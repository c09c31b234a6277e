"""``micro_batch = "auto"`` holds to its own estimate: a train step's peak RSS, measured in a fresh process
(the kernel's high-water mark, reset once the policy is loaded), stays within 1.15x the estimate the
trainer reports (``train/memory_estimate_gib``), with gradient checkpointing and without, the default
heap setting and the shared-prompt layout. The budget is fixed (the same sizes on any machine) and
small enough that the minibatch runs in several micro-batches, so the heap sees blocks of many sizes
freed and made again, as a step of a real run does.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("torch")
pytest.importorskip("peft")

pytestmark = [pytest.mark.train,
              pytest.mark.skipif(platform.system() != "Linux", reason="peak RSS read from /proc/self/status")]

SCRIPT = textwrap.dedent("""
    import json, sys
    from pathlib import Path
    import torch
    from rlvr.backends.model.policy import LoraSpec, Policy
    from rlvr.backends.model.tiny import build_tiny_model
    from rlvr.backends.train import micro_batch
    from rlvr.backends.train.trainer import TorchTrainer
    from rlvr.testing import batch_of
    from rlvr.types import Rollout

    def status_kib(field):
        return next(int(line.split()[1]) for line in Path("/proc/self/status").read_text().splitlines()
                    if line.startswith(field + ":"))

    folder, checkpointing, budget_mib, hidden, layers = sys.argv[1], sys.argv[2] == "ckpt", *map(int, sys.argv[3:])
    torch.set_num_threads(1)
    base = build_tiny_model(folder, hidden=hidden, layers=layers, heads=4, max_positions=512, seed=0)
    policy = Policy(str(base), lora=LoraSpec(rank=8, alpha=16.0), need_reference=False, seed=0)
    micro_batch.free_bytes = lambda device, floor_frac=0.0: 2 * budget_mib * 2**20  # half of it, the budget
    torch.ones(8 << 20).sum()  # a 32 MiB block freed, as loading a real model's weights frees them: glibc now
    # serves every smaller block from its heap, as it does in a run's process
    draw = torch.Generator().manual_seed(0)
    rows = []
    for i in range(24):  # 3 prompts x 8 completions of 160-200 tokens
        prompt = tuple(policy.tokenizer(f"{i // 8}+{i // 8 + 17}=")["input_ids"])
        completion = tuple(torch.randint(5, 60, (160 + 5 * (i % 9),), generator=draw).tolist())
        rows.append(Rollout(task_id=str(i // 8), prompt_ids=prompt, completion_ids=completion,
                            logprobs=(-1.0,) * len(completion), text="", messages=()))
    trainer = TorchTrainer(policy, lr=1e-3, micro_batch="auto", memory_budget_frac=0.5,
                           gradient_checkpointing=checkpointing)
    before = status_kib("VmRSS")
    Path("/proc/self/clear_refs").write_text("5")  # the high-water mark from here on
    metrics = trainer(batch_of(rows, [1.0 if i % 3 else -0.5 for i in range(24)]))
    print(json.dumps({"step_gib": (status_kib("VmHWM") - before) / 2**20, "heap": trainer.heap,
                      "estimate_gib": metrics["train/memory_estimate_gib"], "rows": metrics["train/micro_batch"]}))
""")


def step_peak(tmp_path, checkpointing: bool, budget_mib: int, hidden: int = 256, layers: int = 4) -> dict:
    out = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path / "base"), "ckpt" if checkpointing else "plain",
                          str(budget_mib), str(hidden), str(layers)], capture_output=True, text=True, timeout=600,
                         env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("checkpointing", [False, True], ids=["plain", "ckpt"])
def test_a_steps_peak_rss_stays_within_its_estimate(tmp_path, checkpointing):
    got = step_peak(tmp_path, checkpointing, budget_mib=224)
    assert 1 < got["rows"] < 24, got  # several micro-batches
    assert got["step_gib"] <= 1.15 * got["estimate_gib"], got
