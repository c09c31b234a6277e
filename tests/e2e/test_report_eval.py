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

from rlvr.envs import procedural_task  # noqa: E402
from rlvr.record.run_record import read_record  # noqa: E402
from support.page_check import loaded_images  # noqa: E402

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
corpus_min = 50
heldout_frac = 0.2

[model]
hidden = 32
layers = 2
heads = 2
threads = 1

[task]
name = "addition"
n = 150
params = { digits = 1 }  # learnt by the warm start: held-out scores above 0
eval_data = ["ext={ext}"]

[sft]
steps = 300
target_accuracy = 0.5
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
    rows = procedural_task("addition")[0](40, seed=7, digits=1)
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
    ext = record.run["eval_sets"]["ext"]
    assert ext["n"] == 40 and ext["in_train"] > 0  # one-digit sums: the set shares rows with training, and says so
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


def _steps_done(run: Path) -> int:
    path = run / "events.jsonl"
    if not path.exists():
        return 0
    return sum(1 for line in path.read_text().splitlines() if line.endswith("}") and '"kind": "step"' in line)


def test_report_of_a_sigkilled_run_loads_in_chromium(config, finished, tmp_path):
    run = tmp_path / "killed"
    # Killed long before its end; it starts from the finished run's warm-started base rather than
    # warm-starting its own (the page of a killed run does not depend on how its base was made).
    proc = rlvr("train", str(config), "--out", str(run), "--loop.max_steps=500", f"--model.base={finished / 'base'}",
                "--sft.steps=0")
    deadline = time.monotonic() + 300
    while _steps_done(run) < 2:
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


def run_eval(run: Path, out: Path, *args: str) -> dict:
    finish(rlvr("eval", str(run), *args, "--out", str(out)))
    return json.loads(out.read_text())


def test_eval_greedy_pass_at_1_is_the_heldout_score_and_sampling_raises_pass_at_k(finished, tmp_path):
    record = read_record(finished)
    greedy = run_eval(finished, tmp_path / "greedy.json", "--n", "4", "--temperature", "0")
    assert greedy["step"] == record.selected_step
    assert record.heldout_scores[record.selected_step] > 0  # the warm start makes the equality below non-trivial
    assert {r for t in greedy["per_task"].values() for r in t["rewards"]} <= {0.0, 1.0}  # binary: pass@1 = mean
    assert greedy["pass@1"] == pytest.approx(record.heldout_scores[record.selected_step], abs=1e-9)
    assert greedy["pass@1"] == greedy["pass@4"] == greedy["mean@4"]  # greedy: four identical episodes
    sampled = run_eval(finished, tmp_path / "sampled.json", "--n", "4", "--temperature", "1")
    assert sampled["pass@4"] >= sampled["pass@2"] >= sampled["pass@1"]
    assert sampled["pass@4"] > sampled["pass@1"]  # sampling four times finds answers one draw misses
    ext = run_eval(finished, tmp_path / "ext.json", "--step", "0", "--n", "1", "--temperature", "0",
                   "--data", record.run["eval_sets"]["ext"]["spec"])
    ext0 = next(e for e in record.of_kind("heldout") if e.step == 0).data["eval"]["ext"]["score"]
    assert ext["step"] == 0 and ext["n"] == 1 and ext["pass@1"] == pytest.approx(ext0, abs=1e-9)
