"""The demo config, run briefly through the CLI with all four sinks, read back with each tracker's
own reader: TensorBoard's event reader, the MLflow client, W&B's record schema on the offline run's
log. Each holds the same steps as metrics.jsonl; samples/step_N.jsonl is written at the scheduled
steps. Marked slow: it builds and trains the tiny model (about a minute on two busy cores)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("peft")
pytest.importorskip("tensorboard")
pytest.importorskip("mlflow")
pytest.importorskip("wandb")

from rlvr.record.run_record import read_record  # noqa: E402
from support import wandb_log  # noqa: E402

pytestmark = [pytest.mark.train, pytest.mark.slow]

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "addition.toml"
MAX_STEPS = 4


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> tuple[Path, str]:
    out = tmp_path_factory.mktemp("runs") / "demo"
    cmd = [sys.executable, "-m", "rlvr.cli", "train", str(EXAMPLE), "--out", str(out),
           f"--loop.max_steps={MAX_STEPS}", "--loop.heldout_every=2", "--sft.steps=0", "--loop.tasks_per_step=8",
           "--loop.group_k=4", "--model.threads=1", '--log.sinks=["jsonl", "tensorboard", "mlflow", "wandb"]',
           "--log.log_samples_every=2", "--log.samples_per_step=3", "--log.run_name=demo-run"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    return out, done.stdout


def metric_steps(out: Path) -> list[int]:
    return [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()]


def test_tensorboard_events_hold_every_step_of_metrics_jsonl(run):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out, _ = run
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    acc = EventAccumulator(str(out / "tensorboard"), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    assert [e.step for e in acc.Scalars("rollout/reward")] == metric_steps(out) == list(range(1, MAX_STEPS + 1))
    assert [e.value for e in acc.Scalars("rollout/reward")] == pytest.approx([r["rollout/reward"] for r in rows])
    assert {e.step: e.value for e in acc.Scalars("heldout/score")} == pytest.approx(read_record(out).heldout_scores)
    assert any(t.startswith("train/") for t in acc.Tags()["scalars"])
    assert [e.step for e in acc.Tensors("samples/text_summary")] == [2, 4]
    assert "config/text_summary" in acc.Tags()["tensors"]


def test_mlflow_run_holds_every_step_and_the_resolved_config(run, monkeypatch):
    from mlflow.tracking import MlflowClient

    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # as the README's `mlflow ui` line sets it
    out, _ = run
    client = MlflowClient(tracking_uri=(out / "mlflow").resolve().as_uri())
    (found,) = client.search_runs([client.get_experiment_by_name("rlvr").experiment_id])
    assert found.info.run_name == "demo-run" and found.info.status == "FINISHED"
    history = client.get_metric_history(found.info.run_id, "rollout/reward")
    assert [m.step for m in history] == metric_steps(out)
    assert found.data.params["run_config.loop.max_steps"] == str(MAX_STEPS)
    assert found.data.params["run_config.log.sinks"] == '["jsonl", "tensorboard", "mlflow", "wandb"]'
    assert [a.path for a in client.list_artifacts(found.info.run_id, "samples")] == [
        "samples/step_000002.json", "samples/step_000004.json"]


def test_wandb_offline_run_holds_every_step(run):
    out, _ = run
    (log,) = (out / "wandb").glob("offline-run-*/run-*.wandb")
    history = wandb_log.history(log)
    assert sorted(s for s, items in history.items() if "rollout/reward" in items) == metric_steps(out)
    assert sorted(s for s, items in history.items() if "samples/_type" in items) == [2, 4]
    assert json.loads(wandb_log.config(log)["run_config"])["log"]["run_name"] == "demo-run"


def test_samples_are_written_at_the_scheduled_steps(run):
    out, _ = run
    assert sorted(p.name for p in (out / "samples").iterdir()) == ["step_000002.jsonl", "step_000004.jsonl"]
    record = read_record(out)
    for step, rows in record.samples.items():
        assert len(rows) == 3 * 4  # samples_per_step groups of group_k completions
        assert all(r["step"] == step and r["prompt"] and r["version"] == step - 1 for r in rows)
    assert record.run["sinks"] == ["jsonl", "tensorboard", "mlflow", "wandb"]


def test_progress_is_plain_lines_when_output_is_not_a_terminal(run):
    _, stdout = run
    assert "\x1b[" not in stdout
    assert sum(line.lstrip("[ ").split("]")[-1].strip().startswith("step") for line in stdout.splitlines()) >= MAX_STEPS
