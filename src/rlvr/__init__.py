"""rlvr: reinforcement learning with verifiable rewards, honest about generalisation.

``import rlvr`` pulls in the standard library and pydantic only; backends that need torch,
transformers or an HTTP client live under :mod:`rlvr.backends` and are imported on demand.
"""

from rlvr.config import GRPOConfig
from rlvr.errors import ConfigError, DataError, MissingExtraError, RecordError, RLLoopError, RLVRError
from rlvr.rollouts.advantages import ADVANTAGES, dr_grpo, grpo, rloo
from rlvr.run.hooks import current_rl_hooks, rl_hooks
from rlvr.run.loop import RLLoop
from rlvr.run.record import RunRecord, read_record
from rlvr.types import Batch, CheckpointRef, EvalReport, GateDecision, Group, Progress, Rollout, StopReason, Task
from rlvr.version import __version__

__all__ = [
    "ADVANTAGES", "Batch", "CheckpointRef", "ConfigError", "DataError", "EvalReport", "GRPOConfig",
    "GateDecision", "Group", "MissingExtraError", "Progress", "RLLoop", "RLLoopError", "RLVRError",
    "RecordError", "Rollout", "RunRecord", "StopReason", "Task", "__version__", "current_rl_hooks",
    "dr_grpo", "grpo", "read_record", "rl_hooks", "rloo",
]
