"""The import rules and the public surface, checked from the source.

Layers point one way (core <- envs <- backends <- wiring <- cli, lazy imports counted), no import
circle anywhere in the package (imports inside functions and under ``TYPE_CHECKING`` counted: a
circle of types is still a circle a reader must hold in mind), ``import rlvr`` loads neither
environments nor backends, the core imports without torch, every error class lives in
``rlvr.errors``, and ``ruff check`` is clean. The graph is read with ``ast`` over every module, not
from a list.
"""

from __future__ import annotations

import ast
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import rlvr
from rlvr import errors
from support.child_env import child_env

SRC = Path(__file__).resolve().parents[2] / "src"
LAYERS = {"core": 0, "envs": 1, "backends": 2, "wiring": 3, "cli": 4}


def layer(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in LAYERS else "core"


def modules(root: Path) -> dict[str, Path]:
    """Every module of the package under ``root`` (the folder holding the package), by dotted name."""
    found = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


def import_graph(root: Path) -> tuple[dict[str, set[str]], dict[str, set[str]], dict[str, set[str]]]:
    """``(module_level, every, written)``: the package modules each module imports at module level,
    at run time at all (function-level imports included; ``if TYPE_CHECKING:`` blocks are not imports
    at run time), and every import written, ``TYPE_CHECKING`` ones included."""
    mods = modules(root)

    def owner(name: str) -> str | None:
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name or None

    top: dict[str, set[str]] = {}
    every: dict[str, set[str]] = {}
    written: dict[str, set[str]] = {}
    for mod, path in mods.items():
        tree = ast.parse(path.read_text())
        package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
        skipped = {id(n) for block in ast.walk(tree) if isinstance(block, ast.If)
                   and "TYPE_CHECKING" in ast.unparse(block.test) for n in ast.walk(block)}

        def targets(node: ast.AST, mod: str = mod, package: str = package) -> set[str]:
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            else:
                base = package.split(".")[: len(package.split(".")) - node.level + 1] if node.level else []
                stem = ".".join(base + ([node.module] if node.module else []))
                names = [stem] + [f"{stem}.{a.name}" for a in node.names]
            return {o for o in map(owner, names) if o and o != mod and not mod.startswith(o + ".")}

        top[mod], every[mod], written[mod] = set(), set(), set()
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                written[mod] |= targets(node)
                if id(node) not in skipped:
                    every[mod] |= targets(node)
        stack = list(tree.body)
        while stack:
            node = stack.pop()
            if id(node) in skipped or isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                continue
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                top[mod] |= targets(node)
            stack.extend(ast.iter_child_nodes(node))
    return top, every, written


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


TOP, EVERY, WRITTEN = import_graph(SRC)
CORE_MODULES = sorted(m for m in TOP if layer(m) == "core")
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
    env = child_env()
    out = subprocess.run([sys.executable, "-c", PROBE, ",".join(HEAVY), ",".join(CORE_MODULES)],
                         capture_output=True, text=True, env=env, timeout=60)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_the_package_has_no_import_circle_counting_lazy_and_type_only_imports():
    assert cycles(WRITTEN) == []


def test_imports_point_one_way_core_envs_backends_wiring_cli():
    wrong = sorted(f"{m} -> {t}" for m, ts in EVERY.items() for t in ts if LAYERS[layer(t)] > LAYERS[layer(m)])
    assert wrong == []


def test_only_the_composition_root_and_the_cli_import_backends():
    importers = {m for m, ts in EVERY.items() for t in ts if layer(t) == "backends" and layer(m) != "backends"}
    assert importers and all(m.startswith(("rlvr.wiring", "rlvr.cli")) for m in importers)


def test_the_graph_checks_catch_what_they_guard(tmp_path):
    # A synthetic package with a cycle and a core module importing a backend, lazily.
    pkg = tmp_path / "rlvr"
    (pkg / "backends").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from rlvr import b\n")
    (pkg / "b.py").write_text("from rlvr.a import x\ndef f():\n    from rlvr.backends.t import y\n")
    (pkg / "backends" / "__init__.py").write_text("")
    (pkg / "backends" / "t.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from rlvr import a\n")
    top, every, written = import_graph(tmp_path)
    assert cycles(top) == [["rlvr.a", "rlvr.b"]]
    assert "rlvr.backends.t" in every["rlvr.b"] and "rlvr.backends.t" not in top["rlvr.b"]
    assert every["rlvr.backends.t"] == set()  # TYPE_CHECKING imports are not imports at run time...
    assert written["rlvr.backends.t"] == {"rlvr.a"}  # ...but they close a circle a reader must follow
    assert cycles(written) == [["rlvr.a", "rlvr.b", "rlvr.backends.t"]]


def test_every_error_class_lives_in_the_errors_module():
    outside = []
    for mod, path in modules(SRC).items():
        for node in ast.walk(ast.parse(path.read_text())):
            bases = [ast.unparse(b) for b in node.bases] if isinstance(node, ast.ClassDef) else []
            if any(b.endswith(("Error", "Exception", "Timeout")) for b in bases) and mod != "rlvr.errors":
                outside.append(f"{mod}.{node.name}")
    assert outside == []
    tree = [getattr(errors, n) for n in dir(errors) if isinstance(getattr(errors, n), type)
            and issubclass(getattr(errors, n), Exception)]
    assert all(issubclass(e, errors.RLVRError) for e in tree if e.__module__ == "rlvr.errors")


def test_ruff_is_clean():
    ruff = shutil.which("ruff") or shutil.which("ruff", path=str(Path(sys.executable).parent))
    if ruff is None:
        pytest.skip("ruff is not installed (it is in the test extra)")
    root = SRC.parent
    out = subprocess.run([ruff, "check", "src", "tests", "bench", "examples"], cwd=root, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stdout[-3000:]


def test_import_rlvr_loads_no_environment_and_no_backend():
    env = child_env()
    probe = "import rlvr, sys, json; print(json.dumps(sorted(m for m in sys.modules if m.startswith('rlvr'))))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, timeout=60)
    assert out.returncode == 0, out.stderr
    loaded = json.loads(out.stdout)
    assert "rlvr.run.loop" in loaded
    assert [m for m in loaded if m.startswith(("rlvr.envs", "rlvr.backends", "rlvr.cli"))] == []


def test_core_modules_import_without_heavy_packages():
    result = run_probe()
    assert set(CORE_MODULES) <= set(result["imported"])
    assert result["heavy"] == []


def test_plain_import_rlvr_works_in_a_fresh_interpreter():
    env = child_env()
    out = subprocess.run([sys.executable, "-c", "import rlvr, sys; print(rlvr.__version__, 'torch' in sys.modules)"],
                         capture_output=True, text=True, env=env, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == [rlvr.__version__, "False"]


def test_public_exports_are_pinned():
    assert rlvr.__all__ == [
        "ADVANTAGES", "Batch", "CheckpointRef", "ConfigError", "DataError", "EnvPlan", "EvalReport", "GRPOConfig",
        "GateDecision", "Group", "LoopOptions", "LoopSeams", "MissingExtraError", "Progress", "RLLoop", "RLLoopError",
        "RLVRError", "RecordError", "Rollout", "Run", "RunRecord", "StopReason", "Task", "__version__",
        "current_rl_hooks", "dr_grpo", "grpo", "read_record", "rl_hooks", "rloo", "train",
    ]
    for name in rlvr.__all__:
        assert hasattr(rlvr, name), name


def test_the_notebook_api_is_the_one_lazy_reference_from_the_core_to_the_cli():
    # rlvr.train builds backends, so it lives in the CLI layer; the facade names it by string, on first use.
    named = {m for m, path in modules(SRC).items() if layer(m) == "core" and "rlvr.cli" in
             "".join(ast.unparse(n) for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.Call))}
    assert named == {"rlvr"}
    env = child_env()
    probe = "import rlvr, sys; f = rlvr.train; print('torch' in sys.modules, f.__module__)"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["False", "rlvr.cli.notebook"]


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
