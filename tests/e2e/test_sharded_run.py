"""``rlvr train --nproc 2 --train.shard=fsdp`` with an ``rlvr serve`` sampler: the policy is sharded
over two trainer ranks, each version is gathered and published to the server, held-out is scored
through the server, and the run record is complete; a resume loads the checkpoint on the sharded
ranks and finishes the run.

The first session is stopped at step 0 by the memory watchdog (an RSS cap of 1 MiB), after its
first publish, held-out score and checkpoint; the resumed session (cap lifted) trains the steps.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytest.importorskip("torch")
pytest.importorskip("peft")

from rlvr.record.run_record import read_record  # noqa: E402

pytestmark = [pytest.mark.train, pytest.mark.slow]

CONFIG = """
[loop]
max_steps = 3
tasks_per_step = 4
group_k = 4
temp = 1.0
heldout_every = 1
lr = 5e-3
lora_rank = 4
seed = 3
corpus_min = 20
heldout_frac = 0.2

[model]
hidden = 32
layers = 2
heads = 2

[task]
name = "addition"
n = 60

[train]
shard = "fsdp"

[sampler]
max_new_tokens = 5
backend = "http"
replicas = 1
server_threads = 1
"""


def rlvr(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "rlvr.cli", *map(str, args)], capture_output=True, text=True,
                          timeout=300)


def test_sharded_ranks_publish_to_a_server_score_through_it_and_resume(tmp_path):
    config = tmp_path / "fsdp.toml"
    config.write_text(CONFIG)
    run = tmp_path / "run"
    stopped = rlvr("train", config, "--out", run, "--nproc", "2", "--watchdog.max_rss_mb=1", "--watchdog.persist_s=0")
    assert stopped.returncode == 75, stopped.stdout + stopped.stderr
    assert (run / "checkpoints" / "step_000000" / "trainer" / "adapter" / "adapter_model.safetensors").exists()

    resumed = rlvr("resume", run, "--nproc", "2", "--watchdog.max_rss_mb=1000000")
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    record = read_record(run)
    assert record.finished.data["stop_cause"] == "max_steps"
    assert sorted(record.heldout_scores) == [0, 1, 2, 3]
    seams = json.loads((run / "run.json").read_text())["seams"]
    trainer, sync, heldout = seams["trainer"], seams["weight_sync"], seams["heldout_eval"]
    assert trainer["world_size"] == 2 and trainer["shard"] == "fsdp" and trainer["backend"] == "gloo"
    assert sync["lane"] == "lora_hot_load" and "sharded" in sync["gathered_from"]
    assert "served version checked" in json.dumps(heldout)
    assert sorted(p.name for p in (run / "checkpoints").iterdir())[-1] == "step_000003"
