"""A run's plan: what a :class:`~rlvr.config.run.RunConfig` resolves to, once, before anything is written.

:func:`plan_run` reads the corpus and loads the environments once, carves the split once (a
resumed run's by the rule its record names), and builds the loss settings, the learning-rate
schedule, the credit shaping and the eval sets once; every refusal of a bad config, corpus, filter,
algorithm, lineage, adapter or start fires here, so a refused run leaves its folder untouched.
The :class:`RunPlan` is frozen: the seams and the loop are built from it, and what it built is
handed on, never built again (:func:`~rlvr.wiring.seams.build_seams` trains with its loss and
schedule). Part of the composition root: imports the backends through the levers and the checks.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlvr.backends.train.distributed import current_ranks
from rlvr.backends.train.losses import LossConfig
from rlvr.config.run import RunConfig
from rlvr.data.split import SPLIT_BY, rule_of, summary_line
from rlvr.data.tasks import carve
from rlvr.envs.loading import load_object
from rlvr.envs.trl import needs_answer
from rlvr.errors import ConfigError
from rlvr.lr_schedule import LRSchedule
from rlvr.protocols import LoadedEnv
from rlvr.record.checkpoints import recorded_split
from rlvr.record.lineage import StartLineage, check_lineage
from rlvr.rollouts.shaping import Shaping
from rlvr.types import Split, Task
from rlvr.wiring.adapter_init import inspect_adapter
from rlvr.wiring.agents import check_agent_concurrency
from rlvr.wiring.algorithms import check_algorithms
from rlvr.wiring.eval_sets import eval_set_tasks
from rlvr.wiring.levers import loss_config, lr_schedule, shaping, shown, shown_split
from rlvr.wiring.preflight import check_start
from rlvr.wiring.scale.colocate import check_colocated
from rlvr.wiring.tasks import run_tasks
from rlvr.wiring.trainer import check_critic


@dataclass(frozen=True)
class RunPlan:
    """A run resolved: its config, environments (name → environment, ``{None: env}`` for a run of
    one) and split; the trainer's ``loss`` and ``schedule`` (``None``: built from the config where
    used); the ``shaping``, the eval sets (name → tasks, as shown) and what was found about them
    (``eval_info``), the user's dynamic filter, the start's lineage, the adapter to load, and
    whether the run is resuming its folder."""

    cfg: RunConfig
    envs: dict[str | None, LoadedEnv]
    split: Split | None = None
    loss: LossConfig | None = None
    schedule: LRSchedule | None = None
    shaping: Shaping = Shaping()
    eval_sets: dict[str, list[Task]] = field(default_factory=dict)
    eval_info: dict[str, Any] = field(default_factory=dict)
    dynamic_filter: Any = None
    lineage: StartLineage | None = None
    adapter: dict[str, Any] | None = None
    resuming: bool = False


def plan_run(cfg: RunConfig, run_dir: Path, log: Callable[[str], None] = print) -> RunPlan:
    """The run's plan, every refusal (config, data, corpus floor, filter, lineage, start) fired before
    anything is written to ``run_dir``."""
    loss = loss_config(cfg)
    tasks, envs = run_tasks(cfg)
    # A resumed run's corpus is carved by the split rule its record names: the split it started with.
    resuming = (run_dir / "run.json").exists()
    rule = rule_of(recorded_split(run_dir)) if resuming else SPLIT_BY
    split = shown_split(cfg, carve(tasks, cfg.loop.heldout_frac, cfg.loop.split_salt, cfg.loop.corpus_min, rule))
    if "summary" in split.manifest:
        log(f"rlvr: {summary_line(split.manifest['summary'])}")
    schedule = lr_schedule(cfg, len(split.train))  # a warmup longer than the run is refused here
    run_shaping = shaping(cfg)
    answers = any(needs_answer(e) for e in envs.values())
    eval_sets, eval_info = eval_set_tasks(cfg, split, require_answer=answers)
    eval_sets = {name: shown(cfg, tasks) for name, tasks in eval_sets.items()}
    start = check_lineage(cfg, split)  # a base or adapter trained on held-out rows: refused here, unless allowed
    for name, seen in eval_info.items():
        if seen["in_train"]:
            log(f"eval set {name!r}: {seen['in_train']} of its {seen['n']} rows are also training rows (the same "
                "question or a near-duplicate); they are scored as given, and run.json counts them under eval_sets")
    dynamic_filter = user_filter(cfg)
    check_algorithms(cfg)
    check_agent_concurrency(cfg, envs)
    check_colocated(cfg, current_ranks())
    check_critic(cfg, current_ranks())
    # A resumed run's weights come from its checkpoint: the adapter it started from is history then.
    adapter = inspect_adapter(cfg) if not resuming else None
    check_start(cfg, split)  # the model, the device, the warm start: checked before anything is written
    return RunPlan(cfg, envs, split, loss, schedule, run_shaping, eval_sets, eval_info, dynamic_filter, start,
                   adapter, resuming)


def user_filter(cfg: RunConfig) -> Any:
    """``task.dynamic_filter`` loaded (``None`` without one); refused in a run of several environments,
    which has one filter for every row."""
    filters = [(f"envs.{n}", e.dynamic_filter) for n, e in cfg.envs.items() if e.dynamic_filter]
    if filters:
        raise ConfigError(f"{filters[0][0]}.dynamic_filter: a run of several environments has one filter for every "
                          "row; set loop.filter_zero_variance, or run the environments separately")
    if cfg.task.dynamic_filter is None or cfg.envs:
        return None
    dynamic_filter = load_object(cfg.task.dynamic_filter)
    if not callable(dynamic_filter):
        raise ConfigError(f"task.dynamic_filter={cfg.task.dynamic_filter!r} is not a function of a group")
    return dynamic_filter
