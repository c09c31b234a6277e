"""A warm-started base shared among the in-process runs of a test module.

The warm start (SFT of the tiny model) is often the longest part of an end-to-end run, and runs
that differ only in what they do after it (the algorithm, the number of steps) warm-start the same
model the same way. :class:`SharedBase` keeps the first such run's ``base/`` and copies it into each
later run folder before that run is made. :func:`rlvr.wiring.base.prepare_base` reuses a
``base/`` only when the recipe recorded beside it (the split's content, the model, the task, the
warm-start settings) is the run's own, and refuses it otherwise: a shared base can never stand in
for a different warm start. (``rlvr train`` refuses a folder that is not empty, so this is for runs
made with :func:`rlvr.wiring.seams.make_loop`.)
"""

from __future__ import annotations

import shutil
from pathlib import Path

from rlvr.wiring.base import BASE_DIR


class SharedBase:
    """``seed(run_dir)`` before a run is made, ``keep(run_dir)`` after it has run."""

    def __init__(self, folder: Path):
        self.kept = Path(folder) / BASE_DIR

    def seed(self, run_dir: Path) -> bool:
        """Copy the kept base into ``run_dir`` (a new folder); False when none is kept yet."""
        if not self.kept.exists():
            return False
        shutil.copytree(self.kept, Path(run_dir) / BASE_DIR)
        return True

    def keep(self, run_dir: Path) -> None:
        """Keep ``run_dir``'s base for the runs after it, unless one is kept already."""
        if not self.kept.exists():
            shutil.copytree(Path(run_dir) / BASE_DIR, self.kept)
