"""Metric sinks through the trackers people already use: TensorBoard event files, an MLflow local
file store run, a W&B run (offline unless ``log.wandb_mode`` says online or disabled). Each lives
in the run folder (``tensorboard/``, ``mlflow/``, ``wandb/``) and is fed by the run recorder
(:mod:`rlvr.record.sinks`) with what the record holds.

:func:`open_sinks` opens the sinks a config names; one that cannot start (its package is missing,
its folder cannot be written) is reported in one line and left out, so the run goes on with the
others. The third-party packages are imported only when their sink is opened.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

from rlvr.protocols import MetricSink

TRACKERS = ("tensorboard", "mlflow", "wandb")  # "jsonl" is the run record itself, always written
PACKAGE = {"tensorboard": "tensorboard", "mlflow": "mlflow", "wandb": "wandb"}


def open_sink(name: str, run_dir: Path, project: str, run_name: str, wandb_mode: str = "offline",
              wandb_entity: str | None = None) -> MetricSink:
    """One sink, opened in its folder of ``run_dir``; raises whatever stops it from starting."""
    if name == "tensorboard":
        from rlvr.backends.track.tensorboard_sink import TensorBoardSink

        return TensorBoardSink(run_dir / "tensorboard")
    if name == "mlflow":
        from rlvr.backends.track.mlflow_sink import MlflowSink

        return MlflowSink(run_dir / "mlflow", project, run_name)
    if name == "wandb":
        from rlvr.backends.track.wandb_sink import WandbSink

        return WandbSink(run_dir, project, run_name, mode=wandb_mode, entity=wandb_entity)
    raise ValueError(f"log.sinks: unknown sink {name!r}; known: jsonl, {', '.join(TRACKERS)}")


def open_sinks(names: Sequence[str], run_dir: Path, *, project: str, run_name: str,
               warn: Callable[[str], None] = print, wandb_mode: str = "offline",
               wandb_entity: str | None = None) -> list[MetricSink]:
    """The sinks of ``names`` that started; each that did not (W&B online without a network or a
    login, say) is reported through ``warn``."""
    sinks = []
    for name in names:
        if name == "jsonl":
            continue
        try:
            sinks.append(open_sink(name, run_dir, project, run_name, wandb_mode, wandb_entity))
        except ImportError as exc:
            warn(f"rlvr: metric sink {name!r} not started: {exc.name or exc} is not installed "
                 f"(pip install 'rlvr[track]' or {PACKAGE.get(name, name)}); the run goes on without it")
        except Exception as exc:  # noqa: BLE001 - a tracker that cannot start must not stop the run
            warn(f"rlvr: metric sink {name!r} not started: {type(exc).__name__}: {exc}; the run goes on without it")
    return sinks
