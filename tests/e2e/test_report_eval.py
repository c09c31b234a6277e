"""End-to-end: a real tiny run with an external eval set, its report page (finished and SIGKILLed)
in headless Chromium, and ``rlvr eval`` on its checkpoints.

Marked slow: they train for real.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("peft")

from page_check import loaded_images  # noqa: E402
from rlvr.envs import procedural_task  # noqa: E402
from rlvr.run.record import read_record  # noqa: E402

pytestmark = [pytest.mark.train, pytest.mark.slow]

CONFIG = """
[loop]
max_steps = 4
tasks_per_step = 8
group_k = 4
temp = 1.0
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
eval_data = ["ext={ext}"]

[sft]
steps = 30
batch_size = 32
lr = 3e-3

[sampler]
max_new_tokens = 5
"""


def rlvr(*args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "rlvr.cli", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


def finish(proc: subprocess.Popen, timeout: float = 300) -> str:
    out, _ = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, out
    return out


@pytest.fixture(scope="module")
def config(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("cfg")
    rows = procedural_task("addition")[0](40, seed=7)
    (folder / "ext.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    path = folder / "short.toml"
    path.write_text(CONFIG.replace("{ext}", str(folder / "ext.jsonl")))
    return path


@pytest.fixture(scope="module")
def finished(config, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("runs") / "full"
    finish(rlvr("train", str(config), "--out", str(out)))
    return out


def test_eval_set_is_scored_beside_heldout_and_plotted(finished):
    record = read_record(finished)
    assert record.run["eval_sets"]["ext"]["n"] == 40 and "in_train" in record.run["eval_sets"]["ext"]
    held = record.of_kind("heldout")
    assert [e.step for e in held] == [0, 2, 4] and all("ext" in e.data["eval"] for e in held)
    assert sorted(m["step"] for m in record.metrics if "eval/ext/score" in m) == [0, 2, 4]
    assert record.selected_step == max(record.heldout_scores, key=lambda s: (record.heldout_scores[s], -s))


def test_report_of_a_finished_run_loads_in_chromium(finished):
    out = finish(rlvr("report", str(finished)))
    written = json.loads(out)
    assert written["omitted"] == {}  # a real run has every metric, KL and clip fractions included
    page = Path(written["page"])
    images = loaded_images(page)
    assert set(images) == {p.name for p in page.parent.glob("*.png")} and set(images.values()) == {"yes"}
    assert len(images) == 7


def test_report_of_a_sigkilled_run_loads_in_chromium(config, tmp_path):
    run = tmp_path / "killed"
    proc = rlvr("train", str(config), "--out", str(run))
    deadline = time.monotonic() + 300
    while not (run / "events.jsonl").exists() or '"kind": "step", "step": 2' not in (run / "events.jsonl").read_text():
        assert proc.poll() is None, proc.communicate()[0]
        assert time.monotonic() < deadline, "run made no progress"
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert read_record(run).finished is None
    written = json.loads(finish(rlvr("report", str(run))))
    page = Path(written["page"])
    assert "not finished: stopped midway" in page.read_text()
    images = loaded_images(page)
    assert {"living_model.png", "reward.png", "length.png", "kl_clip.png", "memory.png"} <= set(images)
    assert set(images.values()) == {"yes"}


def test_eval_greedy_pass_at_1_is_the_heldout_score_and_sampling_raises_pass_at_k(finished, tmp_path):
    record = read_record(finished)
    greedy = json.loads(finish(rlvr("eval", str(finished), "--n", "4", "--temperature", "0",
                                    "--out", str(tmp_path / "greedy.json"))))
    assert greedy["step"] == record.selected_step
    rewards = {r for t in json.loads((tmp_path / "greedy.json").read_text())["per_task"].values() for r in t["rewards"]}
    assert rewards <= {0.0, 1.0}  # a binary reward: pass@1 is the mean score
    assert greedy["pass@1"] == pytest.approx(record.heldout_scores[record.selected_step], abs=1e-9)
    assert greedy["pass@1"] == greedy["pass@4"] == greedy["mean@4"]  # greedy: four identical episodes
    sampled = json.loads(finish(rlvr("eval", str(finished), "--n", "4", "--temperature", "1",
                                     "--out", str(tmp_path / "sampled.json"))))
    assert sampled["pass@4"] >= sampled["pass@2"] >= sampled["pass@1"]
    at_base = json.loads(finish(rlvr("eval", str(finished), "--step", "0", "--n", "1", "--temperature", "0",
                                     "--data", record.run["eval_sets"]["ext"]["spec"],
                                     "--out", str(tmp_path / "ext.json"))))
    ext0 = next(e for e in record.of_kind("heldout") if e.step == 0).data["eval"]["ext"]["score"]
    assert at_base["step"] == 0 and at_base["pass@1"] == pytest.approx(ext0, abs=1e-9)
