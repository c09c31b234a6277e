"""The core imports without torch and pins its public surface."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import rlvr
from rlvr import errors

SRC = Path(__file__).resolve().parents[1] / "src"
CORE_MODULES = ["rlvr", "rlvr.config", "rlvr.types", "rlvr.data.tasks", "rlvr.rollouts.advantages", "rlvr.run.gate",
                "rlvr.rollouts.checks", "rlvr.run.loop", "rlvr.run.record", "rlvr.run.hooks", "rlvr.protocols", "rlvr.testing",
                "rlvr.seeding", "rlvr.errors", "rlvr.run.memory"]
HEAVY = ["torch", "numpy", "transformers", "httpx", "vllm"]

# Runs in a fresh interpreter. Heavy packages are made unimportable (so the check holds on a
# machine that has them too), then every core module is imported, plus rlvr.envs and its
# submodules when that package exists.
PROBE = r"""
import importlib, importlib.abc, importlib.util, json, pkgutil, sys

HEAVY = set(sys.argv[1].split(","))

class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in HEAVY:
            raise ImportError(f"{name} is blocked: the rlvr core must not import it")
        return None

sys.meta_path.insert(0, Block())
names = sys.argv[2].split(",")
for name in names:
    importlib.import_module(name)
if importlib.util.find_spec("rlvr.envs") is not None:
    envs = importlib.import_module("rlvr.envs")
    names.append("rlvr.envs")
    for info in pkgutil.iter_modules(envs.__path__, "rlvr.envs."):
        importlib.import_module(info.name)
        names.append(info.name)
print(json.dumps({"imported": names, "heavy": sorted(m for m in sys.modules if m.split(".")[0] in HEAVY)}))
"""


def run_probe() -> dict:
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    out = subprocess.run([sys.executable, "-c", PROBE, ",".join(HEAVY), ",".join(CORE_MODULES)],
                         capture_output=True, text=True, env=env, timeout=60)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_core_modules_import_without_heavy_packages():
    result = run_probe()
    assert set(CORE_MODULES) <= set(result["imported"])
    assert result["heavy"] == []


def test_plain_import_rlvr_works_in_a_fresh_interpreter():
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    out = subprocess.run([sys.executable, "-c", "import rlvr, sys; print(rlvr.__version__, 'torch' in sys.modules)"],
                         capture_output=True, text=True, env=env, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == [rlvr.__version__, "False"]


def test_public_exports_are_pinned():
    assert rlvr.__all__ == [
        "ADVANTAGES", "Batch", "CheckpointRef", "ConfigError", "DataError", "EvalReport", "GRPOConfig",
        "GateDecision", "Group", "MissingExtraError", "Progress", "RLLoop", "RLLoopError", "RLVRError",
        "RecordError", "Rollout", "RunRecord", "StopReason", "Task", "__version__", "current_rl_hooks",
        "dr_grpo", "grpo", "read_record", "rl_hooks", "rloo",
    ]
    for name in rlvr.__all__:
        assert hasattr(rlvr, name), name


def test_every_error_subclasses_the_stdlib_error_it_replaces():
    assert issubclass(errors.RLLoopError, errors.RLVRError) and issubclass(errors.RLLoopError, RuntimeError)
    assert issubclass(errors.ConfigError, ValueError) and not issubclass(errors.ConfigError, errors.RLLoopError)
    assert issubclass(errors.DataError, ValueError)
    assert issubclass(errors.MissingExtraError, ImportError)
    assert issubclass(errors.RecordError, ValueError)
    assert issubclass(errors.UsageError, ValueError)
    assert issubclass(errors.RewardError, errors.EnvError) and issubclass(errors.RewardError, ValueError)
    assert issubclass(errors.CalculatorError, errors.EnvError) and issubclass(errors.CalculatorError, ValueError)
    assert issubclass(errors.GradingTimeout, errors.EnvError) and issubclass(errors.GradingTimeout, TimeoutError)
    assert issubclass(errors.SearchError, errors.EnvError)
    assert issubclass(errors.RequestError, errors.BackendError) and issubclass(errors.RequestError, ValueError)
    assert issubclass(errors.BackendError, RuntimeError) and issubclass(errors.EnvError, RuntimeError)
    for error in (errors.ConfigError, errors.EnvError, errors.BackendError, errors.UsageError):
        assert issubclass(error, errors.RLVRError)


def test_require_extra_names_the_extra_to_install():
    with pytest.raises(errors.MissingExtraError, match=r"rlvr_no_such_package_for_tests.*rlvr\[train\]"):
        errors.require_extra("train", "rlvr_no_such_package_for_tests")
