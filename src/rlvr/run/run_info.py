"""``run.json`` as the loop writes it before step 0: what ran (versions, config and its digest,
seed, split manifest, seams and algorithms described) and when, with the caller's own keys
(``run_info``, e.g. the composition root's engine versions, base and data source) last.

Written once; a resumed run keeps the file it started with. Standard library + pydantic only.
"""

from __future__ import annotations

import platform
from collections.abc import Mapping
from typing import Any

import pydantic

from rlvr.algos import Algorithm
from rlvr.config import GRPOConfig
from rlvr.record.checkpoints import FORMAT as CHECKPOINT_FORMAT
from rlvr.record.run_record import describe
from rlvr.version import __version__


def run_info(config: GRPOConfig, manifest: Mapping[str, Any], created_at: float, seams: Mapping[str, Any],
             algorithms: Mapping[str | None, Algorithm], extra: dict[str, Any]) -> dict[str, Any]:
    """The run's ``run.json``: ``seams`` by the keyword that gives them, ``algorithms`` by environment
    (``""`` for rows that name none); ``extra``'s ``versions`` join rlvr's own."""
    return {"rlvr_version": __version__, "python": platform.python_version(),
            "versions": {"pydantic": pydantic.VERSION, **extra.pop("versions", {})},
            "config": config.model_dump(mode="json"), "config_sha256": config.digest(),
            "seed": config.seed, "base": config.base, "vllm_pin": config.vllm_pin,
            "split": dict(manifest), "created_at": created_at,
            "checkpoint_format": CHECKPOINT_FORMAT,  # every checkpoint has a manifest (checkpoints.py)
            "seams": {n: describe(seam) for n, seam in seams.items()},
            "algorithms": {name or "": algo.describe() for name, algo in algorithms.items()},
            **extra}
