"""What :class:`~rlvr.run.loop.RLLoop` is given: its environments and seams, and the run's options.

``RLLoop(config, bench, seams, options)``: :class:`LoopSeams` holds every injected callable (the
environments with their rollout functions and algorithms, the trainer, the held-out evaluator,
weight sync, the dynamic filter, gauges and what to stop at the end); :class:`LoopOptions` holds
where the record goes and how the run reports and stops (run folder, hooks, watchdog, sinks,
shaping, eval sets...). Both are frozen: a loop's wiring is decided before it runs.

One shape for environments: a run always has a mix of environments, keyed by the name its rows
carry in :attr:`rlvr.types.Task.env`; a run of one environment whose rows name none (``[task]``, or a
notebook's single reward) is the mix ``{None: EnvPlan(...)}``. Standard library only.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rlvr.record.sinks import SampleSchedule
from rlvr.rollouts.shaping import Shaping

if TYPE_CHECKING:
    from rlvr.algos import Algorithm
    from rlvr.protocols import (
        DynamicFilter,
        Environment,
        HeldoutEvaluator,
        MetricSink,
        RewardFn,
        RolloutFn,
        Sampler,
        Trainer,
        WeightSync,
    )
    from rlvr.run.watchdog import MemoryWatchdog
    from rlvr.types import Progress, Task


@dataclass(frozen=True)
class EnvPlan:
    """One environment of a run: its reward (or environment), how its groups are sampled (an async
    per-row ``rollout_fn``, or a batch ``sampler``: one of the two) and the algorithm that credits
    its rows (default: ``grpo`` with the loop's advantage). Rows belong to it by
    :attr:`rlvr.types.Task.env`."""

    reward: RewardFn | Environment
    rollout_fn: RolloutFn | None = None
    algorithm: Algorithm | None = None
    sampler: Sampler | None = None

    @property
    def source(self) -> tuple[str, Any]:
        """The seam that samples this environment's groups, with the keyword that gives it."""
        return ("rollout_fn", self.rollout_fn) if self.rollout_fn is not None else ("sampler", self.sampler)


@dataclass(frozen=True)
class LoopSeams:
    """Every callable the loop calls (:mod:`rlvr.protocols`). ``envs``: name → :class:`EnvPlan`
    (``{None: ...}`` for a run whose rows name no environment). ``weight_sync`` when the sampler
    must be told about new weights; ``dynamic_filter`` drops groups before training (default: the
    zero-variance filter when ``filter_zero_variance``); ``gauges`` reads numbers the backends keep
    (added to every step's metrics and held-out event); ``closers`` stop what was started for the run
    when ``run()`` ends. ``trainer`` and ``heldout_eval`` are required: a missing one is refused
    by name when the run starts."""

    envs: Mapping[str | None, EnvPlan]
    trainer: Trainer | None = None
    heldout_eval: HeldoutEvaluator | None = None
    weight_sync: WeightSync | None = None
    dynamic_filter: DynamicFilter | None = None
    gauges: Callable[[], Mapping[str, float]] | None = None
    closers: Sequence[Callable[[], None]] = ()


@dataclass(frozen=True)
class LoopOptions:
    """How a run records, reports and stops. ``out_dir``: the run folder (none: the record stays in
    memory). ``progress_cb``/``should_abort``: hooks (:mod:`rlvr.run.hooks` for ambient ones).
    ``watchdog`` (:class:`~rlvr.run.watchdog.MemoryWatchdog`) stops the run between steps once it
    trips. ``run_info``: extra keys of run.json. ``sinks`` mirror the record; ``samples`` says which
    steps keep completions in ``samples/`` (:mod:`rlvr.record.sinks`). ``shaping`` shapes every
    scored group around its credit (:class:`~rlvr.rollouts.shaping.Shaping`). ``log`` receives the
    run's warnings about itself (default: print). ``eval_sets`` (name → tasks): external test sets
    scored after every held-out evaluation, recorded, never seen by the gate."""

    out_dir: str | Path | None = None
    progress_cb: Callable[[Progress], None] | None = None
    should_abort: Callable[[], bool] | None = None
    watchdog: MemoryWatchdog | None = None
    clock: Callable[[], float] = time.time
    run_info: Mapping[str, Any] | None = None
    sinks: Sequence[MetricSink] = ()
    samples: SampleSchedule = SampleSchedule()
    shaping: Shaping = Shaping()
    log: Callable[[str], None] | None = None
    eval_sets: Mapping[str, Sequence[Task]] | None = None
