"""An MLflow run in a local file store under ``DIR/mlflow`` (tracking URI ``file:DIR/mlflow``):
the config flattened into params, every scalar as a metric with its step, sample completions as a
table artifact (``samples/step_N.json``). A resumed run continues the same MLflow run (the store
belongs to this run folder, so its one run is this run). MLflow 3 keeps the file store in
maintenance mode behind ``MLFLOW_ALLOW_FILE_STORE=true``, which opening this sink sets for the
process unless it is already set (a database store would cost seconds of migrations per run
folder). Open with ``MLFLOW_ALLOW_FILE_STORE=true mlflow ui --backend-store-uri DIR/mlflow``.
Imports mlflow."""

from __future__ import annotations

import os
import time
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from mlflow.entities import Metric, Param, RunStatus
from mlflow.tracking import MlflowClient

from rlvr.backends.track.common import SAMPLE_COLUMNS, as_text, flatten, safe_key

MAX_PARAM_CHARS = 500  # longer values (long lists) are cut, marked with "…"; run.json keeps them whole
BATCH = 100  # params per log_batch call (MLflow's limit)


class MlflowSink:
    name = "mlflow"

    def __init__(self, store: Path, project: str, run_name: str):
        store.mkdir(parents=True, exist_ok=True)
        os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        self.client = MlflowClient(tracking_uri=store.resolve().as_uri())
        experiment = self.client.get_experiment_by_name(project)
        exp_id = experiment.experiment_id if experiment else self.client.create_experiment(project)
        existing = self.client.search_runs([exp_id], max_results=1)
        if existing:
            self.run_id = existing[0].info.run_id
            self.client.update_run(self.run_id, status=RunStatus.to_string(RunStatus.RUNNING))
        else:
            self.run_id = self.client.create_run(exp_id, run_name=run_name, tags={"rlvr.run": run_name}).info.run_id

    def log_config(self, config: Mapping[str, Any]) -> None:
        params = []
        for key, value in sorted(flatten(config).items()):
            text = as_text(value)
            if len(text) > MAX_PARAM_CHARS:
                text = text[: MAX_PARAM_CHARS - 1] + "…"
            params.append(Param(safe_key(key), text))
        logged = dict(self.client.get_run(self.run_id).data.params)
        fresh = [p for p in params if p.key not in logged]  # a resumed run's params are already there
        for i in range(0, len(fresh), BATCH):
            self.client.log_batch(self.run_id, params=fresh[i : i + BATCH])

    def log_metrics(self, step: int, scalars: Mapping[str, float]) -> None:
        now = int(time.time() * 1000)
        metrics = [Metric(safe_key(k), v, now, step) for k, v in scalars.items()]
        for i in range(0, len(metrics), 1000):
            self.client.log_batch(self.run_id, metrics=metrics[i : i + 1000])

    def log_samples(self, step: int, rows: Sequence[Mapping[str, Any]]) -> None:
        table = {c: [r.get(c) for r in rows] for c in SAMPLE_COLUMNS}
        with warnings.catch_warnings():
            # pandas' notice about MLflow's own dtype query: nothing a user of rlvr can act on
            warnings.filterwarnings("ignore", message=".*select_dtypes.*")
            self.client.log_table(self.run_id, data=table, artifact_file=f"samples/step_{step:06d}.json")

    def close(self) -> None:
        self.client.set_terminated(self.run_id, status=RunStatus.to_string(RunStatus.FINISHED))

    def describe(self) -> dict[str, Any]:
        return {"type": "mlflow", "dir": "mlflow", "run_id": self.run_id}
