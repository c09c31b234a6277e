"""The benchmark scripts (``bench/*.py``) as modules for the tests.

The scripts import one another by bare name (``from cpu_share import ...``), as they do when run
as ``python bench/x.py`` with ``bench/`` first on the path. :func:`bench_module` puts ``bench/`` on
the path the same way before importing, so a test file needs none of its neighbours to have
loaded a script first: each runs alone.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from types import ModuleType

BENCH = Path(__file__).resolve().parents[2] / "bench"


def bench_module(name: str) -> ModuleType:
    """``bench/<name>.py``, imported (once) with ``bench/`` on ``sys.path``."""
    if str(BENCH) not in sys.path:
        sys.path.insert(0, str(BENCH))
    module = importlib.import_module(name)
    if Path(module.__file__ or "").resolve().parent != BENCH:
        raise ImportError(f"{name!r} resolved to {module.__file__}, not to bench/{name}.py")
    return module
