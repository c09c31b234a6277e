"""The environment of a child Python that must import this checkout's rlvr.

``SRC`` comes first, so the child imports the code under test; the parent's own ``PYTHONPATH``
follows, since rlvr's dependencies may live there (an install made with ``pip --target``, a packed
environment) and a child without them would fail on its first import for a reason the test does
not check.
"""

from __future__ import annotations

import os
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src"


def python_path() -> str:
    return os.pathsep.join(filter(None, [str(SRC), os.environ.get("PYTHONPATH")]))


def child_env(**extra: str) -> dict[str, str]:
    """This process's environment with :func:`python_path`, and ``extra`` on top."""
    return {**os.environ, "PYTHONPATH": python_path(), **extra}
