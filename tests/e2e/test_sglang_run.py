"""A whole training run with ``sampler.backend = "sglang"``: rollouts sampled through SGLang's native
``/generate`` and each step's adapter hot-loaded through ``/load_lora_adapter``, the server being
``rlvr serve`` (which speaks those routes) started through ``serve_command``, since SGLang's own
build needs CUDA. Marked slow: it trains for real."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytest.importorskip("torch")
pytest.importorskip("peft")

from rlvr.record.run_record import read_record  # noqa: E402

pytestmark = [pytest.mark.train, pytest.mark.slow]

SHORT = """
[loop]
tasks_per_step = 8
group_k = 4
heldout_every = 2
lr = 5e-3
lora_rank = 4
seed = 3
corpus_min = 100
heldout_frac = 0.2

[model]
hidden = 32
layers = 2
heads = 2
threads = 1

[task]
name = "addition"
n = 150

[sampler]
max_new_tokens = 5
"""


def rlvr(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "rlvr.cli", *args], stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=600, check=False)


def test_a_run_samples_and_syncs_through_sglangs_native_api(tmp_path):
    config = tmp_path / "short.toml"
    config.write_text(SHORT)
    run = tmp_path / "sglang"
    serve = (f"{sys.executable} -m rlvr.cli serve {{model_dir}} --host {{host}} --port {{port}} "
             f"--served-model-name policy --allowed-dir {run / 'sync'}")
    done = rlvr("train", str(config), "--out", str(run), "--sampler.backend=sglang", f"--sampler.serve_command={serve}",
                "--sampler.timeout_s=60", "--loop.max_steps=4")
    assert done.returncode == 0, done.stdout[-3000:]
    record = read_record(run)
    sync = record.run["seams"]["weight_sync"]
    assert record.finished.data["stop_cause"] == "max_steps"
    assert sync["lane"] == "lora_hot_load" and sync["server_api"] == "sglang"
    assert len(record.of_kind("step")) == 4
    import rlvr as package

    assert sync["server"]["version"] == package.__version__  # read through SGLangApi.info
