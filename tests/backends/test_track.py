"""The metric sinks through the real trackers, read back with each tracker's own reader:
TensorBoard's EventAccumulator, MLflow's client, W&B's record schema on the offline run's log.
Also: a sink that cannot start is reported in one line and the others open."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlvr.backends.track import open_sinks

CONFIG = {"config": {"lr": 1e-4, "group_k": 4}, "task": {"name": "addition", "params": {"digits": 2}}}
STEPS = {1: {"rollout/reward": 0.25, "train/loss": 1.5}, 2: {"rollout/reward": 0.5, "train/loss": 1.0},
         3: {"rollout/reward": 0.75, "train/loss": 0.5}}
ROWS = [{"step": 2, "task_id": "t|1", "sample": i, "prompt": "2+2=", "completion": c, "reward": r,
         "advantage": a, "version": 1} for i, (c, r, a) in enumerate((("4", 1.0, 0.7), ("5\n", 0.0, -0.7)))]


def feed(sink) -> None:
    sink.log_config(CONFIG)
    sink.log_metrics(0, {"heldout/score": 0.1})
    for step, scalars in STEPS.items():
        sink.log_metrics(step, scalars)
        if step == 2:
            sink.log_samples(step, ROWS)
    sink.close()


def test_tensorboard_events_read_back_with_tensorboards_reader(tmp_path):
    pytest.importorskip("tensorboard")
    pytest.importorskip("torch")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    (sink,) = open_sinks(["jsonl", "tensorboard"], tmp_path, project="p", run_name="r")
    feed(sink)
    acc = EventAccumulator(str(tmp_path / "tensorboard"), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    assert [(e.step, e.value) for e in acc.Scalars("rollout/reward")] == [(1, 0.25), (2, 0.5), (3, 0.75)]
    assert [e.step for e in acc.Scalars("heldout/score")] == [0]
    tags = acc.Tags()["tensors"]
    assert "config/text_summary" in tags and "samples/text_summary" in tags
    (samples,) = acc.Tensors("samples/text_summary")
    text = samples.tensor_proto.string_val[0].decode()
    assert samples.step == 2 and "t\\|1" in text and "5⏎" in text  # cells escaped for Markdown
    config = acc.Tensors("config/text_summary")[0].tensor_proto.string_val[0].decode()
    assert "| task.params.digits | 2 |" in config


def test_tensorboard_hides_the_steps_a_resumed_session_redoes(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    (first,) = open_sinks(["tensorboard"], tmp_path, project="p", run_name="r")
    for step in range(5):
        first.log_metrics(step, {"rollout/reward": float(step)})
    first.close()  # killed after step 4; the last checkpoint was step 3
    (again,) = open_sinks(["tensorboard"], tmp_path, project="p", run_name="r")
    for step in (4, 5):
        again.log_metrics(step, {"rollout/reward": 10.0 + step})
    again.close()
    acc = EventAccumulator(str(tmp_path / "tensorboard"))
    acc.Reload()
    assert [(e.step, e.value) for e in acc.Scalars("rollout/reward")] == [
        (0, 0.0), (1, 1.0), (2, 2.0), (3, 3.0), (4, 14.0), (5, 15.0)]


def test_mlflow_run_read_back_with_the_mlflow_client(tmp_path, monkeypatch):
    pytest.importorskip("mlflow")
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # what the sink sets; restored after the test
    from mlflow.tracking import MlflowClient

    (sink,) = open_sinks(["mlflow"], tmp_path, project="demo", run_name="run-a")
    feed(sink)
    client = MlflowClient(tracking_uri=(tmp_path / "mlflow").resolve().as_uri())
    (run,) = client.search_runs([client.get_experiment_by_name("demo").experiment_id])
    assert run.info.run_name == "run-a" and run.info.status == "FINISHED"
    assert run.data.params["config.lr"] == "0.0001" and run.data.params["task.params.digits"] == "2"
    history = client.get_metric_history(run.info.run_id, "rollout/reward")
    assert [(m.step, m.value) for m in history] == [(1, 0.25), (2, 0.5), (3, 0.75)]
    local = Path(client.download_artifacts(run.info.run_id, "samples/step_000002.json", str(tmp_path)))
    table = json.loads(local.read_text())
    assert [row[table["columns"].index("completion")] for row in table["data"]] == ["4", "5\n"]
    # A second session (a resumed run) continues the same MLflow run, its params already there.
    (again,) = open_sinks(["mlflow"], tmp_path, project="demo", run_name="run-a")
    again.log_config(CONFIG)
    again.log_metrics(4, {"rollout/reward": 1.0})
    again.close()
    (run,) = client.search_runs([client.get_experiment_by_name("demo").experiment_id])
    assert [m.step for m in client.get_metric_history(run.info.run_id, "rollout/reward")] == [1, 2, 3, 4]


def test_wandb_offline_run_read_back_from_its_log(tmp_path):
    pytest.importorskip("wandb")
    from support import wandb_log

    (sink,) = open_sinks(["wandb"], tmp_path, project="demo", run_name="run-a")
    feed(sink)
    (log,) = (tmp_path / "wandb").glob("offline-run-*/run-*.wandb")
    steps = wandb_log.history(log)
    assert sorted(steps) == [0, 1, 2, 3]
    assert [float(steps[s]["rollout/reward"]) for s in (1, 2, 3)] == [0.25, 0.5, 0.75]
    assert json.loads(steps[2]["samples/_type"]) == "table-file" and steps[2]["samples/nrows"] == "2"
    config = wandb_log.config(log)
    assert json.loads(config["config"])["lr"] == 1e-4
    (table,) = (tmp_path / "wandb").glob("offline-run-*/files/media/table/samples_2_*.table.json")
    assert json.loads(table.read_text())["data"][1][4] == "5\n"


def test_a_sink_that_cannot_start_says_why_in_one_line_and_the_others_open(tmp_path):
    pytest.importorskip("tensorboard")
    (tmp_path / "mlflow").write_text("a file where the store's folder should be")
    lines: list[str] = []
    sinks = open_sinks(["jsonl", "mlflow", "tensorboard"], tmp_path, project="p", run_name="r", warn=lines.append)
    assert [s.name for s in sinks] == ["tensorboard"]
    assert len(lines) == 1 and "'mlflow' not started" in lines[0] and "\n" not in lines[0]
    for s in sinks:
        s.close()


def test_a_missing_package_names_the_extra(tmp_path, monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "wandb", None)  # as if wandb were not installed
    monkeypatch.delitem(sys.modules, "rlvr.backends.track.wandb_sink", raising=False)
    lines: list[str] = []
    assert open_sinks(["wandb"], tmp_path, project="p", run_name="r", warn=lines.append) == []
    assert len(lines) == 1 and "wandb is not installed" in lines[0] and "rlvr[track]" in lines[0]


def test_wandb_mode_and_entity_reach_wandb_init(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    import wandb

    from rlvr.backends.track import wandb_sink

    calls: list[dict] = []

    class Run:
        id = "abc123"

    monkeypatch.setattr(wandb, "init", lambda **kwargs: calls.append(kwargs) or Run())
    (sink,) = open_sinks(["wandb"], tmp_path, project="demo", run_name="run-a", wandb_mode="online",
                         wandb_entity="team")
    assert {k: calls[0][k] for k in ("mode", "entity", "project", "name", "id")} == {
        "mode": "online", "entity": "team", "project": "demo", "name": "run-a", "id": None}
    assert sink.describe() == {"type": "wandb", "dir": "wandb", "mode": "online", "run_id": "abc123"}
    # A resumed session continues the latest earlier one, online or offline.
    for name in ("offline-run-20250101_000000-aaa", "run-20250102_000000-bbb", "latest-run"):
        (tmp_path / "wandb" / name).mkdir()
    assert wandb_sink._earlier_run_id(tmp_path / "wandb") == "bbb"
    wandb_sink.WandbSink(tmp_path, "demo", "run-a", mode="offline")
    assert calls[-1]["id"] == "bbb" and calls[-1]["resume"] == "allow"
    with pytest.raises(ValueError, match="log.wandb_mode='live'"):
        wandb_sink.WandbSink(tmp_path, "demo", "run-a", mode="live")


def test_wandb_disabled_writes_no_run(tmp_path):
    pytest.importorskip("wandb")
    (sink,) = open_sinks(["wandb"], tmp_path, project="demo", run_name="run-a", wandb_mode="disabled")
    feed(sink)
    assert sink.describe()["mode"] == "disabled"
    assert not list((tmp_path / "wandb").glob("*run-*"))
