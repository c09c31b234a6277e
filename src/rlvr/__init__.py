"""rlvr: reinforcement learning with verifiable rewards, honest about generalisation.

``import rlvr`` pulls in the standard library and pydantic only; backends that need torch,
transformers or an HTTP client live under :mod:`rlvr.backends` and are imported on demand.

``rlvr.train`` and ``rlvr.Run`` (the notebook API) build backends, so they live in the composition root
(:mod:`rlvr.cli.notebook`); this facade names them and imports that module at their first use. It is
the one place the core refers to the CLI layer, by name and lazily, so ``import rlvr`` stays light.
"""

import importlib
from typing import Any

from rlvr.algos.advantages import ADVANTAGES, dr_grpo, grpo, rloo
from rlvr.config import GRPOConfig
from rlvr.errors import ConfigError, DataError, MissingExtraError, RecordError, RLLoopError, RLVRError
from rlvr.record.run_record import RunRecord, read_record
from rlvr.run.hooks import current_rl_hooks, rl_hooks
from rlvr.run.inputs import EnvPlan, LoopOptions, LoopSeams
from rlvr.run.loop import RLLoop
from rlvr.types import Batch, CheckpointRef, EvalReport, GateDecision, Group, Progress, Rollout, StopReason, Task
from rlvr.version import __version__

__all__ = [
    "ADVANTAGES", "Batch", "CheckpointRef", "ConfigError", "DataError", "EnvPlan", "EvalReport", "GRPOConfig",
    "GateDecision", "Group", "LoopOptions", "LoopSeams", "MissingExtraError", "Progress", "RLLoop", "RLLoopError",
    "RLVRError", "RecordError", "Rollout", "Run", "RunRecord", "StopReason", "Task", "__version__",
    "current_rl_hooks", "dr_grpo", "grpo", "read_record", "rl_hooks", "rloo", "train",
]

_NOTEBOOK = ("Run", "train")


def __getattr__(name: str) -> Any:
    if name in _NOTEBOOK:
        return getattr(importlib.import_module("rlvr.cli.notebook"), name)
    raise AttributeError(f"module 'rlvr' has no attribute {name!r}")
