"""What :class:`~rlvr.run.loop.RLLoop` is given: its environments and seams, and the run's options.

``RLLoop(config, bench, seams, options)``: :class:`LoopSeams` holds every injected callable (the
environments with their rollout functions and algorithms, the trainer, the held-out evaluator,
weight sync, the dynamic filter, gauges and what to stop at the end); :class:`LoopOptions` holds
where the record goes and how the run reports and stops (run folder, hooks, watchdog, sinks,
shaping, eval sets...). Both are frozen: a loop's wiring is decided before it runs.

One shape for environments: a run always has a mix of environments, keyed by the name its rows
carry in :attr:`rlvr.types.Task.env`; a run of one environment whose rows name none (``[task]``, or a
notebook's single reward) is the mix ``{None: EnvPlan(...)}``. What the loop derives from its inputs
once, before it runs, is here too: the carved split, each environment's checked algorithm, its group
sampler and the stream's rules. Standard library + pydantic only.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rlvr.algos import GRPO, Algorithm
from rlvr.config import GRPOConfig
from rlvr.data.tasks import carve, load_tasks
from rlvr.errors import RLLoopError
from rlvr.protocols import GroupFn
from rlvr.record.sinks import SampleSchedule
from rlvr.rollouts.episodes import group_from_rollout_fn, group_from_sampler
from rlvr.rollouts.shaping import Shaping
from rlvr.rollouts.stream import StreamConfig

if TYPE_CHECKING:
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

from rlvr.types import Split


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


def carved(bench: Iterable[Any] | Split, config: GRPOConfig, rule: str) -> Split:
    """The corpus carved by the config's rules and the split ``rule`` (a resumed run's: the one its
    record names); a :class:`Split` given as ``bench`` (carved once by the caller, e.g. to warm-start
    on its training side) must have been carved by the same rules."""
    if not isinstance(bench, Split):
        return carve(load_tasks(bench), config.heldout_frac, config.split_salt, config.corpus_min, rule)
    given = (bench.heldout_frac, bench.salt, bench.corpus_min)
    if given != (config.heldout_frac, config.split_salt, config.corpus_min):
        raise RLLoopError(f"the split given was carved with (heldout_frac, split_salt, corpus_min) = {given}, "
                          f"but the config says {(config.heldout_frac, config.split_salt, config.corpus_min)}")
    return bench


def checked_algorithms(seams: LoopSeams, config: GRPOConfig) -> dict[str | None, Algorithm]:
    """Each environment's algorithm (default: ``grpo`` with ``config.advantage``), refused before a
    run starts where it cannot work: a group-relative credit with ``group_k = 1``, a critic's credit
    with a trainer that has no critic."""
    default = GRPO(str(config.advantage))
    algorithms = {name: plan.algorithm or default for name, plan in seams.envs.items()}
    for algo in algorithms.values():
        algo.check(config.group_k)
    critic_users = [a.label() for a in algorithms.values() if a.needs_critic]
    if critic_users and seams.trainer is not None and not getattr(seams.trainer, "has_critic", False):
        raise RLLoopError(f"{critic_users[0]}: its credit comes from a critic's values, and the trainer "
                          f"({type(seams.trainer).__name__}) has none; train with rlvr's torch trainer and its "
                          "critic ([critic], docs/critic.md), or pick another loop.advantage")
    return algorithms


def stop_all(closers: list[Callable[[], None]], log: Callable[[str], None]) -> None:
    """Call and remove every closer, newest first; one that fails is logged and the others still run
    (the run's own result or error matters more)."""
    while closers:
        close = closers.pop()
        try:
            close()
        except Exception as exc:  # noqa: BLE001 - the run's own result or error matters more
            log(f"rlvr: stopping {getattr(close, '__qualname__', close)!s} failed: {type(exc).__name__}: {exc}")


def group_of(plan: EnvPlan, timeout_s: float | None) -> GroupFn:
    """How an environment's groups are sampled: its per-row ``rollout_fn`` (each call bounded by
    ``timeout_s``), else its batch ``sampler``."""
    if plan.rollout_fn is not None:
        return group_from_rollout_fn(plan.rollout_fn, timeout_s)
    return group_from_sampler(plan.sampler)  # type: ignore[arg-type]


def stream_config(config: GRPOConfig, shaping: Shaping) -> StreamConfig:
    """The rollout stream's admission and scoring rules, from the loop config."""
    return StreamConfig(
        rows_per_batch=config.tasks_per_step, group_k=config.group_k, max_offpolicy=config.max_head_offpolicy_versions,
        synchronous=config.synchronous_training, max_in_flight=config.max_rows_in_flight,
        max_rows_per_batch=config.rows_per_batch_cap, min_group_size=config.group_minimum,
        on_sample_error=config.on_sample_error, seed=config.seed, reward_timeout_s=config.reward_timeout_s,
        shaping=shaping)
