"""External eval sets (``[task] eval_data``): read as tasks tagged like the run's rows, with what
the run record says of each, so rows shared with the training split are counted, never hidden.

Part of the composition root; standard library + rlvr core only.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from rlvr.config.run import RunConfig
from rlvr.data.readers import read_tasks
from rlvr.data.twins import twins_of
from rlvr.errors import ConfigError
from rlvr.types import Split, Task
from rlvr.wiring.fields import field_map


def eval_set_tasks(cfg: RunConfig, split: Split,
                   require_answer: bool = True) -> tuple[dict[str, list[Task]], dict[str, Any]]:
    """``eval_data`` of ``[task]`` (or of each ``[envs.NAME]``, named ``NAME/set``) as tasks tagged like
    the run's rows, and what run.json says of each: spec, size, and how many of its rows are on
    each side of the split, as the same question or a near-duplicate (:mod:`rlvr.data.twins`; rows
    also trained on are scored, and said so). ``require_answer=False``: prompt-only rows, for rewards
    that take no answer."""
    sections = cfg.env_sections()
    sets: dict[str, list[Task]] = {}
    info: dict[str, Any] = {}
    for env_name, section in sections.items():
        where = "task" if env_name is None else f"envs.{env_name}"
        try:
            named = section.eval_sets()
            for name, spec in named.items():
                key = name if env_name is None else f"{env_name}/{name}"
                tasks = read_tasks(spec, fields=field_map(section),  # mapped as the section's own rows
                                   max_row_bytes=section.max_row_bytes(), require_answer=require_answer)
                if env_name is not None:
                    tasks = [dataclasses.replace(t, id=f"{env_name}/{t.id}", env=env_name) for t in tasks]
                sets[key] = tasks
                in_train, in_heldout = twins_of([split.train, split.heldout], tasks)
                info[key] = {"spec": spec, "n": len(tasks), "in_train": sum(in_train), "in_heldout": sum(in_heldout)}
        except ConfigError as exc:
            raise ConfigError(f"{where}.eval_data: {str(exc).removeprefix('task.eval_data: ')}") from None
    return sets, info
