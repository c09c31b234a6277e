"""``rlvr train --nproc 2`` with ``shard = "fsdp"`` and ``checkpoint_layout = "sharded"``: each rank
writes its own shards of the checkpoint (no adapter gathered into it), ``rlvr resume`` continues the run
on one process from those shards, and ``rlvr export`` turns the selected checkpoint into the plain PEFT
adapter and merged model.

The first session is stopped at step 0 by the memory watchdog (an RSS cap of 1 MiB), after its first
checkpoint; the resumed session (cap lifted) trains the steps.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

pytest.importorskip("torch")
pytest.importorskip("peft")

from rlvr.record.run_record import read_record  # noqa: E402

pytestmark = [pytest.mark.train, pytest.mark.slow]

CONFIG = """
[loop]
max_steps = 2
tasks_per_step = 4
group_k = 4
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
checkpoint_layout = "sharded"

[sampler]
max_new_tokens = 5
backend = "http"
replicas = 1
server_threads = 1
"""


def rlvr(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "rlvr.cli", *map(str, args)], capture_output=True, text=True,
                          timeout=300)


def test_two_ranks_checkpoint_their_shards_one_process_resumes_and_the_export_is_plain(tmp_path):
    config = tmp_path / "fsdp.toml"
    config.write_text(CONFIG)
    run = tmp_path / "run"
    stopped = rlvr("train", config, "--out", run, "--nproc", "2", "--watchdog.max_rss_mb=1", "--watchdog.persist_s=0")
    assert stopped.returncode == 75, stopped.stdout + stopped.stderr
    trainer = run / "checkpoints" / "step_000000" / "trainer"
    assert sorted(p.name for p in (trainer / "sharded").glob("*.distcp")) == ["__0_0.distcp", "__1_0.distcp"]
    assert not (trainer / "adapter").exists()

    resumed = rlvr("resume", run, "--watchdog.max_rss_mb=1000000")  # one process, from two ranks' shards
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    record = read_record(run)
    assert record.finished.data["stop_cause"] == "max_steps"
    assert sorted(record.heldout_scores) == [0, 1, 2]
    assert len(list((run / "checkpoints" / "step_000002" / "trainer" / "sharded").glob("*.distcp"))) == 1

    exported = rlvr("export", run, "--out", tmp_path / "export")
    assert exported.returncode == 0, exported.stdout + exported.stderr
    check = ("import sys; from peft import AutoPeftModelForCausalLM; "
             "m = AutoPeftModelForCausalLM.from_pretrained(sys.argv[1]); print(type(m).__name__)")
    loaded = subprocess.run([sys.executable, "-c", check, str(tmp_path / "export" / "adapter")], capture_output=True,
                            text=True, timeout=120, cwd=tmp_path / "export")
    assert loaded.returncode == 0 and "PeftModel" in loaded.stdout, loaded.stderr
    assert (tmp_path / "export" / "merged" / "config.json").exists()
