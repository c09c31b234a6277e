"""RLLoop: split → rollout stream → group-relative step → publish → held-out gate → selection.

The loop owns the control flow and nothing that touches a GPU: the rollout function (or a simple
sampler), trainer, weight sync and held-out evaluator are injected callables (see
:mod:`rlvr.protocols` and :mod:`rlvr.rollouts.episodes`). Sampling, scoring, grouping and filtering happen in
the background :class:`~rlvr.rollouts.stream.RolloutStream`; the loop asks it for a batch, trains, publishes
the new weights and says so. Sync or async is the stream's admission rule, not a branch here.
Its invariants:
- the held-out split is carved before step 0 and never sampled for training;
- held-out is scored at step 0, at least every ``heldout_every`` steps, and at the end (its stable
  sample of at most ``heldout_max_rows`` rows, with as many training rows scored the same way:
  :mod:`rlvr.data.subsample`);
- the published checkpoint is the best on held-out only (ties: earliest);
- every checkpoint carries the loop state a resume needs, and resume redoes nothing twice; it loads
  only a checkpoint that matches its manifest and never loses a record row (:mod:`rlvr.record.checkpoints`);
- no sample older than ``max_head_offpolicy_versions`` versions is trained on.
Standard library + pydantic only.
"""

from __future__ import annotations

import shutil
import time
import traceback
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from rlvr.algos import GRPO, Algorithm
from rlvr.config import GRPOConfig
from rlvr.data.split import SPLIT_BY, rule_of
from rlvr.data.subsample import evaluation_rows
from rlvr.data.tasks import TaskCursor, carve, load_tasks, mean, other_split_reason
from rlvr.errors import AbortedError, RecordError, RecordWarning, RLLoopError, aborted_by, exception_text
from rlvr.lr_schedule import schedule_horizon
from rlvr.protocols import (
    Checkpointable,
    DynamicFilter,
    Environment,
    HeldoutEvaluator,
    RewardFn,
    RolloutFn,
    Sampler,
    Trainer,
    WeightSync,
)
from rlvr.record.checkpoints import FORMAT as CHECKPOINT_FORMAT
from rlvr.record.checkpoints import RECORD_DIR, Checkpoints, recorded_split, write_manifest
from rlvr.record.gain import observed_in_unit_interval
from rlvr.record.run_record import (
    STATE_FILE,
    TRAINER_DIR,
    EventKind,
    RunRecord,
    RunRecorder,
    checkpoint_name,
    complete_checkpoints,
    describe,
    disk_errors,
    event_of,
    write_json_atomic,
)
from rlvr.record.sinks import SinkFanout
from rlvr.reward import reward_callable
from rlvr.rollouts.checks import check_staleness
from rlvr.rollouts.episodes import group_from_rollout_fn, group_from_sampler
from rlvr.rollouts.stream import RolloutStream, Route, RowSource, StreamConfig, zero_variance_filter
from rlvr.run.advice import RunAdvice
from rlvr.run.evaluation import counting_rows, eval_report
from rlvr.run.gate import HeldoutGate
from rlvr.run.hooks import current_rl_hooks
from rlvr.run.inputs import EnvPlan, LoopOptions, LoopSeams
from rlvr.run.memory import PhaseTrace, peak_rss_mb, rss_mb
from rlvr.types import CheckpointRef, EvalReport, Phase, Progress, Split, StopCause, StopReason, Task, Trajectory
from rlvr.version import __version__

ROWS_SHOWN_EVERY_S = 0.5  # an evaluation's row count is redrawn at most this often


class RLLoop:
    """One RL run. ``run()`` returns its :class:`~rlvr.record.run_record.RunRecord`.

    ``RLLoop(config, bench, seams, options)``. ``bench`` is the corpus: rows (dicts, validated here),
    tasks, or a :class:`~rlvr.types.Split` already carved by this config's rules. ``seams``
    (:class:`~rlvr.run.inputs.LoopSeams`) holds the environments (name → :class:`EnvPlan`, each
    row's :attr:`~rlvr.types.Task.env` naming its own; ``{None: ...}`` when rows name none) and every
    injected callable; ``options`` (:class:`~rlvr.run.inputs.LoopOptions`) where the record goes and
    how the run reports and stops. :meth:`from_reward` builds both from one reward and keyword seams,
    as a notebook writes it. The run ends at ``max_steps``, or sooner once the training split has been
    seen ``epochs`` times (its stop cause says which), or on patience, abort or the watchdog.
    """

    def __init__(self, config: GRPOConfig, bench: Iterable[Any] | Split, seams: LoopSeams | None = None,
                 options: LoopOptions | None = None, **old_keywords: Any):
        if not isinstance(config, GRPOConfig):
            raise RLLoopError(f"config must be a GRPOConfig, got {type(config).__name__}")
        if not isinstance(seams, LoopSeams) or old_keywords:
            raise RLLoopError("RLLoop takes (config, bench, LoopSeams(envs={name: EnvPlan(...)}, trainer=..., "
                              "heldout_eval=...), LoopOptions(...)); for a reward and keyword seams (sampler=, "
                              "rollout_fn=, trainer=, ...) call RLLoop.from_reward(config, reward, bench, ...)")
        options = options or LoopOptions()
        self.config, self.bench, self.seams, self.options = config, bench, seams, options
        self.envs = dict(seams.envs)
        if not self.envs:
            raise RLLoopError("RLLoop needs at least one environment: LoopSeams(envs={name: EnvPlan(...)})")
        self.default_algorithm = GRPO(str(config.advantage))
        self.algorithms = {name: plan.algorithm or self.default_algorithm for name, plan in self.envs.items()}
        self.rewards = {name: reward_callable(plan.reward) for name, plan in self.envs.items()}
        for algo in self.algorithms.values():
            algo.check(config.group_k)  # e.g. a group-relative credit with group_k = 1: refused before anything runs
        self.trainer, self.heldout_eval, self.weight_sync = seams.trainer, seams.heldout_eval, seams.weight_sync
        critic_users = [a.label() for a in self.algorithms.values() if a.needs_critic]
        if critic_users and self.trainer is not None and not getattr(self.trainer, "has_critic", False):
            raise RLLoopError(f"{critic_users[0]}: its credit comes from a critic's values, and the trainer "
                              f"({type(self.trainer).__name__}) has none; train with rlvr's torch trainer and its "
                              "critic ([critic], docs/critic.md), or pick another loop.advantage")
        self.dynamic_filter = seams.dynamic_filter or (zero_variance_filter if config.filter_zero_variance else None)
        self.shaping = options.shaping
        self.out_dir = Path(options.out_dir) if options.out_dir is not None else None
        self._explicit_hooks = (options.progress_cb, options.should_abort)
        self._hooks_at_init = current_rl_hooks()
        self.clock, self.extra_info = options.clock, dict(options.run_info or {})
        self.gauges = seams.gauges or dict
        self.recorder = RunRecorder(self.out_dir, options.clock, SinkFanout(options.sinks), options.samples)
        self._closers = list(seams.closers)  # what was started for this run: stopped when run() ends (close())
        self._log = options.log or print
        self.gate = HeldoutGate(config.heldout_patience)
        self.advice = RunAdvice(config.warn_flat_steps, options.log)
        self.pool_scores: dict[int, float] = {}
        self.train_eval_scores: dict[int, float] = {}  # training rows scored like held-out (the gap's other side)
        self.heldout_by_env: dict[str, dict[int, float]] = {}
        # External test sets: scored by heldout_eval beside held-out, recorded, never seen by the gate.
        self.eval_sets = {name: list(tasks) for name, tasks in (options.eval_sets or {}).items()}
        self.eval_scores: dict[str, dict[int, float]] = {}
        self.step = self.version = 0
        self.mem_trace: dict[str, float] = {}  # per-phase peaks over the run (see PhaseTrace)
        self.mem, self.watchdog, self.abort_reason = PhaseTrace(), options.watchdog, None
        self.stop_cause: StopCause | None = None
        self._recording, self._phase_now, self._last_ckpt = False, Phase.SETUP, None
        self._admitted_before = 0  # rows admitted and consumed before this session (after a resume)
        self.rows_seen = 0  # training rows consumed (trained or filtered) over the whole run: loop.epochs
        self._started = time.monotonic()

    @classmethod
    def from_reward(cls, config: GRPOConfig, reward: RewardFn | Environment | None, bench: Iterable[Any] | Split, *,
                    sampler: Sampler | None = None, trainer: Trainer | None = None,
                    heldout_eval: HeldoutEvaluator | None = None, rollout_fn: RolloutFn | None = None,
                    algorithm: Algorithm | None = None, envs: Mapping[str | None, EnvPlan] | None = None,
                    dynamic_filter: DynamicFilter | None = None, weight_sync: WeightSync | None = None,
                    gauges: Callable[[], Mapping[str, float]] | None = None,
                    closers: Sequence[Callable[[], None]] = (), **options: Any) -> RLLoop:
        """A loop from one ``reward`` (a ``reward_fn(messages, answer)`` or an environment) and keyword
        seams: ``rollout_fn`` or ``sampler``, ``trainer``, ``heldout_eval``, ``weight_sync``,
        ``algorithm``... (:class:`~rlvr.run.inputs.LoopSeams`), and the run's options by their
        :class:`~rlvr.run.inputs.LoopOptions` names (``out_dir=``, ``progress_cb=``, ``sinks=``...).
        A run of several environments gives ``envs`` (name → :class:`EnvPlan`) with ``reward=None``."""
        if envs and (reward is not None or rollout_fn is not None or sampler is not None or algorithm is not None):
            raise RLLoopError("a run of several environments takes envs={name: EnvPlan(...)} only: leave reward, "
                              "rollout_fn, sampler and algorithm to each EnvPlan")
        plans = dict(envs) if envs else {None: EnvPlan(reward, rollout_fn, algorithm, sampler)}  # type: ignore[arg-type]
        seams = LoopSeams(plans, trainer, heldout_eval, weight_sync, dynamic_filter, gauges, closers)
        return cls(config, bench, seams, LoopOptions(**options))

    # ---- public results -------------------------------------------------------------------
    @property
    def heldout_scores(self) -> dict[int, float]:
        return dict(self.gate.scores)

    @property
    def selected_step(self) -> int | None:
        return self.gate.best_step

    @property
    def selected_heldout_score(self) -> float | None:
        return self.gate.best_score

    def summary(self) -> dict[str, Any]:
        """A JSON-serialisable digest of the run."""
        held, base = self.heldout_scores, self.gate.scores.get(0)
        # Like for like: training rows scored as held-out is (greedy, same budget); without them, the pool.
        train = self.train_eval_scores if self.config.train_eval else self.pool_scores
        gap = {s: train[s] - h for s, h in held.items() if s in train}
        return {
            "selected_step": self.selected_step, "selected_heldout_score": self.selected_heldout_score,
            "baseline_heldout_score": base,
            "heldout_gain": None if base is None or self.selected_heldout_score is None
            else self.selected_heldout_score - base,
            # Gains read as points only when every reward seen lies in [0, 1] (rlvr.record.gain).
            "rewards_in_unit_interval": observed_in_unit_interval(self.recorder.metrics, held, self.pool_scores,
                                                                  self.train_eval_scores),
            "final_heldout_score": held[max(held)] if held else None,
            "final_pool_score": self.pool_scores[max(self.pool_scores)] if self.pool_scores else None,
            "pool_heldout_gap": gap, "max_pool_heldout_gap": max(gap.values(), default=None),
            "gap_basis": ("training rows scored like held-out" if self.config.train_eval
                          else "pool score: mean reward of training samples"),
            "train_eval_scores": dict(self.train_eval_scores),
            "heldout_scores": held, "pool_scores": dict(self.pool_scores),
            **({"heldout_by_env": {k: dict(v) for k, v in self.heldout_by_env.items()}} if self.heldout_by_env else {}),
            **({"eval_scores": {k: dict(v) for k, v in self.eval_scores.items()}} if self.eval_scores else {}),
            "steps_run": self.step, "stop_cause": self.stop_cause and str(self.stop_cause),
            "config_sha256": self.config.digest(),
        }

    # ---- running --------------------------------------------------------------------------
    def run(self, *, resume: bool = False) -> RunRecord:
        """Run to ``max_steps`` or ``epochs`` (or patience, or abort). ``resume=True`` continues ``out_dir``.
        What was started for the run is stopped as it returns or raises (:meth:`close`)."""
        try:
            return self._run(resume)
        finally:
            self.close()

    def _run(self, resume: bool) -> RunRecord:
        self._check_seams()
        # Explicit hooks win; then those bound where run() is called; then where the loop was built.
        ambient, built = current_rl_hooks(), self._hooks_at_init
        self.progress_cb = self._explicit_hooks[0] or ambient.progress_cb or built.progress_cb
        self.should_abort = self._explicit_hooks[1] or ambient.should_abort or built.should_abort
        split = self._split(resume)
        scored = evaluation_rows(split, self.config.heldout_max_rows, self.config.train_eval)
        self.heldout_tasks, self.train_eval_tasks = scored.heldout, scored.train
        self.cursor = TaskCursor(split.train, self.config.seed)
        self._train_by_id = {t.id: t for t in split.train}  # to restore a checkpoint's pending rows
        manifest = {**split.manifest, **scored.manifest}
        self.stream = self._stream()
        self.stream_left: dict[str, Any] = {}
        stopped: BaseException | None = None
        if self.watchdog is not None:
            self.watchdog.start(self.mem.observe)
        try:
            pending = self._restore(manifest) if resume else []
            self._publish(self.version)  # the sampler serves this policy before any row is admitted
            self.stream.start(RowSource(self.cursor, [(self._train_by_id[i], d) for i, d in pending]), self.version)
            if not resume:
                self._start(manifest)
            self._last_step_end = time.monotonic()
            while self.stop_cause is None:
                self._tick()
        except (KeyboardInterrupt, SystemExit, AbortedError) as exc:
            stopped = self._abort(exc)  # Ctrl-C, or user code asking to stop: recorded, resumably
        except BaseException as exc:
            self._record_failure(exc)
            self.recorder.close()  # a failed run: its trackers keep what they were given
            raise
        finally:
            self.stream_left = self.stream.close()
            if self.watchdog is not None:
                self.watchdog.stop()
        try:
            if stopped is not None:
                if self._recording:
                    self._finish()
                raise stopped
            return self._finish()
        finally:
            self.recorder.close()

    def close(self) -> None:
        """Stop what was started for this run (``closers``: its engines, servers, proxies, workers), each
        once, in reverse order; ``run()`` calls it as it returns or raises (after the sample stream has
        stopped asking), so a process that goes on (a notebook, a test session) does not keep a finished
        run's servers and their memory. A closer that fails is reported and the others still run."""
        while self._closers:
            close = self._closers.pop()
            try:
                close()
            except Exception as exc:  # noqa: BLE001 - the run's own result or error matters more
                self._log(f"rlvr: stopping {getattr(close, '__qualname__', close)!s} failed: "
                          f"{type(exc).__name__}: {exc}")

    def _abort(self, exc: BaseException) -> AbortedError:
        """Stop on purpose: record why and checkpoint if between two steps (mid-step state is
        never saved: the last checkpoint stays the one to resume from); the error to raise."""
        if isinstance(exc, AbortedError):
            error = exc
        elif isinstance(exc, KeyboardInterrupt):
            error = AbortedError(f"interrupted at step {self.step + 1} (Ctrl-C); `rlvr resume` continues the run")
            error.__cause__ = exc
        else:
            error = aborted_by(exc, f"step {self.step + 1}")
        if not self._recording:
            return error  # nothing recorded yet: there is no run to resume
        self.stop_cause = StopCause.ABORTED
        self._seam_warnings(self.step)
        self.recorder.event(EventKind.ABORTED, self.step, reason=str(error))
        if self._phase_now is Phase.SAMPLE and self._last_ckpt != self.step:
            self._checkpoint()
        return error

    def _record_failure(self, exc: BaseException) -> None:
        """An error that ends a recording run: its message and full traceback in events.jsonl (the
        console shows one line)."""
        if not self._recording:
            return
        try:
            self.recorder.event(EventKind.FAILED, self.step, error=exception_text(exc),
                                traceback="".join(traceback.format_exception(exc)))
        except RecordError:
            pass  # the disk that refused the run refuses its epitaph too: the error raised is the first one

    def _split(self, resume: bool) -> Split:
        """The corpus carved by this run's rules (a resumed run's by the split rule its record names);
        a :class:`Split` given as ``bench`` (carved once by the caller, e.g. to warm-start on its
        training side) must have been carved by the same rules."""
        cfg = self.config
        if not isinstance(self.bench, Split):
            rule = rule_of(recorded_split(self.out_dir)) if resume and self.out_dir is not None else SPLIT_BY
            return carve(load_tasks(self.bench), cfg.heldout_frac, cfg.split_salt, cfg.corpus_min, rule)
        given = (self.bench.heldout_frac, self.bench.salt, self.bench.corpus_min)
        if given != (cfg.heldout_frac, cfg.split_salt, cfg.corpus_min):
            raise RLLoopError(f"the split given was carved with (heldout_frac, split_salt, corpus_min) = {given}, "
                              f"but the config says {(cfg.heldout_frac, cfg.split_salt, cfg.corpus_min)}")
        return self.bench

    def _routes(self) -> dict[str | None, Route]:
        timeout = self.config.rollout_timeout_s
        return {name: Route(group_from_rollout_fn(plan.rollout_fn, timeout) if plan.rollout_fn is not None
                            else group_from_sampler(plan.sampler),  # type: ignore[arg-type]
                            self.rewards[name], self.algorithms[name]) for name, plan in self.envs.items()}

    def _stream(self) -> RolloutStream:
        cfg = self.config
        return RolloutStream(self._routes(), StreamConfig(
            rows_per_batch=cfg.tasks_per_step, group_k=cfg.group_k, max_offpolicy=cfg.max_head_offpolicy_versions,
            synchronous=cfg.synchronous_training, max_in_flight=cfg.max_rows_in_flight,
            max_rows_per_batch=cfg.rows_per_batch_cap, min_group_size=cfg.group_minimum,
            on_sample_error=cfg.on_sample_error, seed=cfg.seed, reward_timeout_s=cfg.reward_timeout_s,
            shaping=self.shaping), self.dynamic_filter)

    def _tick(self) -> None:
        """Decide what happens next: abort, a train step, or the end."""
        cfg = self.config
        if self.step >= cfg.max_steps:
            self.stop_cause = StopCause.MAX_STEPS
            return
        if self._epochs_done():
            self.stop_cause = StopCause.EPOCHS
            return
        if self.watchdog is not None and self.watchdog.tripped:
            self._stop_between_steps(str(self.watchdog.abort_reason), self.watchdog.abort_details)
            return
        if self.should_abort is not None and self.should_abort():
            self._stop_between_steps("should_abort returned true", {})
            return
        self._train_step()
        # Every evaluated step is checkpointed: selection may pick any of them.
        evaluate = self._last_step() or self.step % cfg.heldout_every == 0
        if evaluate and self._heldout():
            self.stop_cause = StopCause.PATIENCE
        if evaluate or self.step % cfg.checkpoint_period == 0:
            self._checkpoint()

    def _epochs_done(self) -> bool:
        """Whether the training split has been seen ``loop.epochs`` times (never, without epochs)."""
        epochs = self.config.epochs
        return epochs is not None and self.rows_seen >= epochs * len(self._train_by_id)

    def _last_step(self) -> bool:
        return self.step >= self.config.max_steps or self._epochs_done()

    def _stop_between_steps(self, reason: str, details: dict[str, Any]) -> None:
        """Stop on request at a safe point: recorded with its reason, checkpointed, resumable."""
        self.stop_cause, self.abort_reason = StopCause.ABORTED, reason
        self.recorder.event(EventKind.ABORTED, self.step, reason=reason, **details)
        if self._last_ckpt != self.step:
            self._checkpoint()

    def _train_step(self) -> None:
        cfg, step, version = self.config, self.step + 1, self.version
        self._phase(Phase.SAMPLE, step)
        t0 = time.monotonic()
        batch = self.stream.next_batch()
        t1, busy0 = time.monotonic(), self.stream.busy_seconds()
        if not batch.groups:
            reasons = sorted({d.reason for d in batch.filtered})
            raise RLLoopError(
                f"step {step}: all {batch.admitted} rows admitted for this batch were filtered "
                f"(max_oversample={cfg.max_oversample}); reasons: {reasons[:5]}. The task may be too easy or "
                "too hard for the policy, or the dynamic filter too strict.")
        self.rows_seen += len(batch.groups) + len(batch.filtered)
        # The staleness guarantee, checked where it matters: on what is about to be trained.
        rollouts = batch.rollouts
        frozen = {id(g) for g in batch.groups if not self.stream.route(g.task).algorithm.samples_from_policy}
        for g in batch.groups:  # frozen-sourced rows (a frozen model's samples) never age
            for r in g.rollouts:
                check_staleness(r, version, cfg.max_head_offpolicy_versions, frozen=id(g) in frozen)
        self._phase(Phase.TRAIN, step)
        metrics = dict(self.trainer(batch) or {})
        t2, busy1 = time.monotonic(), self.stream.busy_seconds()
        self._publish(version + 1)
        t3 = time.monotonic()
        self.step, self.version = step, version + 1
        if not self._last_step():  # no batch is sampled that no step will train (it would slow the last held-out)
            self.stream.trained()
        rewards = [r.reward for r in rollouts]
        self.pool_scores[step] = pool = mean(rewards)
        zero_std = sum(len(set(g.rewards)) == 1 for g in batch.groups) / len(batch.groups)
        lengths = [len(r.completion_ids) for r in rollouts]
        offsets = [version - r.version for g in batch.groups if id(g) not in frozen  # type: ignore[operator]
                   for r in g.rollouts] or [0]
        step_time = t3 - self._last_step_end
        self._last_step_end = t3
        self.recorder.event(EventKind.STEP, step, pool_score=pool, version=self.version,
                            task_ids=[g.task.id for g in batch.groups], admitted=batch.admitted,
                            short=len(batch.groups) < cfg.tasks_per_step,
                            filtered=[d.as_dict() for d in batch.filtered],
                            sample_drops=[d.as_dict() for d in batch.sample_drops])
        self.recorder.metric(step, {
            "rollout/reward": pool, "rollout/reward_std": _std(rewards),
            "rollout/reward_min": min(rewards), "rollout/reward_max": max(rewards),
            "rollout/zero_std_frac": zero_std, "rollout/completion_len": mean(lengths),
            **_trajectory_metrics(batch.trajectories),
            "rollout/truncated_frac": mean([r.stop_reason == StopReason.LENGTH for r in rollouts]),
            "rollout/filter_drop_ratio": batch.filter_drop_ratio,
            "rollout/sample_drops": len(batch.sample_drops), "rollout/groups": len(batch.groups),
            "data/epochs_seen": self.rows_seen / len(self._train_by_id),
            "async/version_offset_max": max(offsets), "async/version_offset_mean": mean(offsets),
            **_reward_metrics(rollouts), **_env_metrics(batch.groups),
            **{k: v for k, v in metrics.items() if isinstance(v, (int, float))},
            "perf/sample_wait_time": t1 - t0, "perf/train_time": t2 - t1, "perf/weight_sync_time": t3 - t2,
            "perf/step_time": step_time, "time/scoring": batch.scoring_s,
            "perf/wait_time_ratio": (t1 - t0) / step_time if step_time > 0 else 0.0,
            "perf/overlap_ratio": (busy1 - busy0) / (t2 - t1) if t2 > t1 else 0.0,
            "mem/rss_mb": rss_mb(), **self._mem_now(), **self.gauges(),
        })
        self.recorder.sample(step, batch.groups)
        self.advice.observe(step, batch.groups)

    def _publish(self, version: int) -> None:
        """Hand the weights of ``version`` to the sampler and check it serves them."""
        served = self.weight_sync(version) if self.weight_sync is not None else None
        if served is not None and served != version:
            raise RLLoopError(f"step {self.step}: the sampler serves policy version {served} after publishing "
                              f"version {version}; refusing to sample from stale weights")

    def _heldout(self) -> bool:
        """Score held-out for the current policy; True if patience says stop."""
        self._phase(Phase.HELDOUT, self.step)
        report = self._evaluate(self.heldout_tasks)
        decision = self.gate.observe(self.step, report.score)
        by_env = _by_env(self.heldout_tasks, report.per_task)
        for name, score in by_env.items():
            self.heldout_by_env.setdefault(name, {})[self.step] = score
        self.recorder.event(EventKind.HELDOUT, self.step, score=report.score,
                            n=report.n if report.n is not None else len(self.heldout_tasks),
                            pool_score=self.pool_scores.get(self.step), best_step=decision.best_step,
                            improved=decision.improved, evals_since_best=decision.evals_since_best,
                            **({"by_env": by_env} if by_env else {}), **self._train_eval(report.score),
                            **self._eval_sets(),
                            **self._mem_peaks(Phase.HELDOUT), **self.gauges())
        return decision.stop

    def _train_eval(self, heldout_score: float) -> dict[str, Any]:
        """Score the training sample exactly as held-out was scored (:mod:`rlvr.data.subsample`): the
        like-for-like side of the pool-vs-held-out gap; never seen by the gate."""
        if not self.train_eval_tasks:
            return {}
        report = self._evaluate(self.train_eval_tasks)
        self.train_eval_scores[self.step] = report.score
        return {"train_score": report.score, "gap": report.score - heldout_score,
                "train_n": report.n if report.n is not None else len(self.train_eval_tasks)}

    def _eval_sets(self) -> dict[str, Any]:
        """Score every external eval set with the held-out evaluator (after the gate has decided)."""
        if not self.eval_sets:
            return {}
        scored = {}
        for name, tasks in self.eval_sets.items():
            report = self._evaluate(tasks)
            scored[name] = {"score": report.score, "n": report.n if report.n is not None else len(tasks)}
            self.eval_scores.setdefault(name, {})[self.step] = report.score
        self.recorder.metric(self.step, {f"eval/{name}/{key}": value for name, result in scored.items()
                                         for key, value in result.items()})
        return {"eval": scored}

    # ---- checkpoints ----------------------------------------------------------------------
    def _ckpt_dir(self, step: int) -> Path:
        assert self.out_dir is not None
        return self.out_dir / checkpoint_name(step)

    def _checkpoint(self) -> CheckpointRef:
        self._phase(Phase.CHECKPOINT, self.step)
        parent = self._last_ckpt
        path = None
        if self.out_dir is not None:
            final = self._ckpt_dir(self.step)
            tmp = final.with_name(final.name + ".tmp")
            resume_from = "no complete checkpoint yet" if parent is None else f"the last complete one is step {parent}"
            try:
                with disk_errors(f"checkpoint {checkpoint_name(self.step)}",
                                 f"{resume_from}: free space, then `rlvr resume` continues from it"):
                    shutil.rmtree(tmp, ignore_errors=True)
                    tmp.mkdir(parents=True)
                    if isinstance(self.trainer, Checkpointable):
                        self.trainer.save(str(tmp / TRAINER_DIR))
                    # Recorded before the state is written, so the state's record offsets include it.
                    self.recorder.event(EventKind.CHECKPOINT, self.step, parent=parent,
                                        path=checkpoint_name(self.step))
                    write_json_atomic(tmp / STATE_FILE, self._state(parent))
                    self.recorder.write_copy(tmp / RECORD_DIR)  # what a damaged record is rebuilt from
                    write_manifest(tmp)  # last: a resume trusts only files that match it
            except RecordError:
                shutil.rmtree(tmp, ignore_errors=True)  # give back what the half-written checkpoint took
                raise
            shutil.rmtree(final, ignore_errors=True)
            tmp.rename(final)
            path = checkpoint_name(self.step)
            self._prune()
        else:
            self.recorder.event(EventKind.CHECKPOINT, self.step, parent=parent, path=None)
        if self.gate.best_step is not None:
            self._write_selected()  # only now: the published checkpoint must exist on disk
        self._last_ckpt = self.step
        return CheckpointRef(self.step, path, parent)

    def _state(self, parent: int | None) -> dict[str, Any]:
        snapshot = self.stream.snapshot()
        admitted = snapshot.pop("admitted")  # this session's count; the state keeps the whole run's
        return {"step": self.step, "version": self.version, "parent": parent, **snapshot,
                "rows_admitted": self._admitted_before + admitted, "gate": self.gate.state(),
                "pool_scores": {str(k): v for k, v in self.pool_scores.items()},
                "stop_cause": self.stop_cause and str(self.stop_cause),
                "record_offsets": self.recorder.offsets(), "seed": self.config.seed}

    def _prune(self) -> None:
        done = complete_checkpoints(self.out_dir)  # type: ignore[arg-type]
        keep = set(done[-self.config.keep_last:])
        if self.gate.best_step is not None:
            keep.add(self._ckpt_dir(self.gate.best_step))
        for p in done:
            if p not in keep:
                shutil.rmtree(p)

    # ---- start, resume, finish ------------------------------------------------------------
    def _named_seams(self) -> dict[str, Any]:
        """The seams by the keyword that gives them (the first environment's ``rollout_fn`` or
        ``sampler`` stands for the rollout side): checked as the run starts, described in run.json."""
        source, seam = next(iter(self.envs.values())).source
        return {source: seam, "trainer": self.trainer, "heldout_eval": self.heldout_eval,
                **({"weight_sync": self.weight_sync} if self.weight_sync is not None else {})}

    def _check_seams(self) -> None:
        if any(p.sampler is not None and p.rollout_fn is not None for p in self.envs.values()):
            raise RLLoopError("pass either sampler=(tasks, k) -> groups or rollout_fn=async (row) -> sample, not both")
        for name, seam in [*(p.source for p in self.envs.values()), *self._named_seams().items()]:
            if seam is None:
                raise RLLoopError(f"RLLoop needs a {name}: pass {name}=... (see rlvr.testing for fakes)")
            if not callable(seam):
                raise RLLoopError(f"{name} must be callable, got {type(seam).__name__}")

    def _start(self, manifest: dict[str, Any]) -> None:
        self.recorder.write_run_info(self._run_info(manifest))
        self._recording = True
        self.recorder.event(EventKind.START, 0, n_train=manifest["n_train"], n_heldout=manifest["n_heldout"])
        self._heldout()
        self._checkpoint()

    def _run_info(self, manifest: dict[str, Any]) -> dict[str, Any]:
        import platform

        import pydantic

        return {"rlvr_version": __version__, "python": platform.python_version(),
                "versions": {"pydantic": pydantic.VERSION, **self.extra_info.pop("versions", {})},
                "config": self.config.model_dump(mode="json"), "config_sha256": self.config.digest(),
                "seed": self.config.seed, "base": self.config.base, "vllm_pin": self.config.vllm_pin,
                "split": manifest, "created_at": self.clock(),
                "checkpoint_format": CHECKPOINT_FORMAT,  # every checkpoint has a manifest (checkpoints.py)
                "seams": {n: describe(seam) for n, seam in self._named_seams().items()},
                "algorithms": {name or "": algo.describe() for name, algo in self.algorithms.items()},
                **self.extra_info}

    def _restore(self, manifest: dict[str, Any]) -> list[tuple[str, int]]:
        if self.out_dir is None:
            raise RLLoopError("resume needs out_dir: the run folder to continue")
        if not (self.out_dir / "run.json").exists() and not complete_checkpoints(self.out_dir):
            raise RLLoopError(f"{self.out_dir}: the run never reached step 0 (no run.json), so there is nothing to "
                              "resume; `rlvr train` with the same --out starts it again there")
        found = Checkpoints(self.out_dir)
        run = found.run_info()
        then, now = dict(run.get("config", {})), self.config.model_dump(mode="json")
        # A key the record lacks was added to rlvr after the run began: the run had its default.
        defaults = GRPOConfig().model_dump(mode="json")
        changed = sorted(k for k in now.keys() | then.keys()
                         if k != "max_steps" and then.get(k, defaults.get(k)) != now.get(k))
        if changed:
            raise RLLoopError(f"{self.out_dir}: resume needs the config the run started with; "
                              f"these fields differ: {changed} (only max_steps may change)")
        split = run.get("split", {})
        if (split.get("heldout_hash"), split.get("train_hash")) != (manifest["heldout_hash"], manifest["train_hash"]):
            raise RLLoopError(f"{self.out_dir}: the corpus does not give the split this run was started with "
                              f"({other_split_reason(split)})")
        if not complete_checkpoints(self.out_dir):
            raise RLLoopError(f"{self.out_dir}: no complete checkpoint to resume from; `rlvr train` with the same "
                              "--out starts the run again there")
        ckpt, state = found.open(self._load_trainer)  # the newest that checks out; damaged ones set aside
        stopped = self._reload_record(found, ckpt, state, run)
        for e in self.recorder.events:  # per-environment and eval-set scores kept by the record, for the summary
            if e.kind is EventKind.HELDOUT:
                for name, score in e.data.get("by_env", {}).items():
                    self.heldout_by_env.setdefault(name, {})[e.step] = score
                for name, result in e.data.get("eval", {}).items():
                    self.eval_scores.setdefault(name, {})[e.step] = result["score"]
                if "train_score" in e.data:
                    self.train_eval_scores[e.step] = e.data["train_score"]
        self.recorder.sinks.log_config(run)  # this session's trackers start with the run's config
        self.step, self.version, self._last_ckpt = state["step"], state["version"], state["step"]
        self._recording = True
        # Rows admitted and consumed before the checkpoint; its pending rows are admitted again now.
        self._admitted_before = state.get("rows_admitted", 0) - len(state.get("pending", []))
        self.rows_seen = self._admitted_before  # every row admitted and not pending was trained or filtered
        self.cursor.restore(state["cursor"])
        self.gate.restore(state["gate"])
        self.pool_scores = {int(k): v for k, v in state["pool_scores"].items()}
        self.stop_cause = StopCause(state["stop_cause"]) if state["stop_cause"] else None
        if self.stop_cause is StopCause.ABORTED:
            self.stop_cause = None  # an aborted run is resumable: carry on from here
        self._write_selected()  # a crash may have left selected.json ahead of the checkpoints
        self.recorder.event(EventKind.RESUMED, self.step, from_checkpoint=checkpoint_name(self.step),
                            **({"after_abort": stopped[-1].data} if stopped else {}))
        pending = list(state.get("pending", []))
        unknown = [i for i in pending if i not in self._train_by_id]
        if unknown:
            raise RLLoopError(f"{self.out_dir}: the checkpoint's pending rows {unknown[:3]} are not training rows")
        # A checkpoint written before draws were recorded: give each pending row a draw of its own.
        draws = state.get("pending_draws") or [-1 - n for n in range(len(pending))]
        return list(zip(pending, draws, strict=True))

    def _reload_record(self, found: Checkpoints, ckpt: Path, state: dict[str, Any], run: dict[str, Any]) -> list[Any]:
        """The record up to ``ckpt`` (rebuilt from its copy where a run file lost rows), rewound to it on
        disk, with a warning for every repair; returns the abort events written after it."""
        events, metrics, later = found.rows(ckpt, state["record_offsets"])
        self.recorder.events, self.recorder.metrics = [event_of(r) for r in events], metrics
        self.recorder.run_info = run
        self.recorder.rewind(state["record_offsets"])
        for note in found.notes:  # said once, and kept in the record
            warnings.warn(note, RecordWarning, stacklevel=3)
            self.recorder.event(EventKind.WARNING, state["step"], reason=note)
        # Why the run stopped is kept past the rewind: the resumed event carries the last abort's reason.
        return [e for e in map(event_of, later) if e.kind is EventKind.ABORTED]

    def _load_trainer(self, ckpt: Path, state: dict[str, Any]) -> None:
        if isinstance(self.trainer, Checkpointable):
            self.trainer.load(str(ckpt / TRAINER_DIR))
        elif state["step"] > 0:
            raise RLLoopError("the trainer has no save()/load(): its weights cannot be resumed")

    def _write_selected(self) -> None:
        best = self.gate.best_step
        assert best is not None
        self.recorder.write_selected({
            "step": best, "heldout_score": self.gate.best_score,
            "baseline_heldout_score": self.gate.scores.get(0),
            "checkpoint": checkpoint_name(best) if self.out_dir else None,
            "pool_score": self.pool_scores.get(best), "heldout_scores": self.gate.scores,
            "rule": "best held-out score; ties keep the earliest step; pool score never used",
        })

    def _finish(self) -> RunRecord:
        if self.stop_cause in (StopCause.MAX_STEPS, StopCause.EPOCHS) and self.step not in self.gate.scores:
            self._heldout()  # only when resuming a run that stopped between its last step and eval
            self._checkpoint()
        self._phase(Phase.DONE, self.step)
        self.recorder.event(EventKind.SELECTED, self.step, selected_step=self.selected_step,
                            heldout_score=self.selected_heldout_score)
        self.recorder.event(EventKind.FINISHED, self.step, stop_cause=str(self.stop_cause),
                            summary=self.summary(),
                            rows_admitted=self._admitted_before + self.stream_left.get("admitted", 0),
                            unconsumed_rows=self.stream_left.get("unconsumed", []),
                            filtered_after_last_step=self.stream_left.get("filtered", []),
                            sample_drops_after_last_step=self.stream_left.get("sample_drops", []),
                            **{f"mem/{k}": v for k, v in self.mem_trace.items()},
                            **(self.watchdog.summary() if self.watchdog is not None else {}))
        return self.recorder.record()

    # ---- reporting ------------------------------------------------------------------------
    def _phase(self, phase: Phase, step: int) -> None:
        self._phase_now = phase
        self.mem.enter(phase)
        self.mem_trace = {**self.mem.run_peaks, "process_peak_mb": round(peak_rss_mb(), 1)}
        if self.watchdog is not None and self._recording:
            for warning in self.watchdog.take_warnings():
                self.recorder.event(EventKind.WARNING, step, **warning)
        self._seam_warnings(step)
        self._progress(phase, step)

    def _progress(self, phase: Phase, step: int, rows: tuple[int, int] | None = None) -> None:
        """Tell the progress hook where the run is (``rows``: an evaluation's rows done / total)."""
        if self.progress_cb is None:
            return
        elapsed, done = time.monotonic() - self._started, max(step - 1, 0)
        cfg = self.config
        total = schedule_horizon(cfg.max_steps, cfg.epochs, len(self._train_by_id), cfg.tasks_per_step)
        eta = elapsed / done * (total - done) if done and phase is not Phase.DONE else None
        last = self.gate.scores[max(self.gate.scores)] if self.gate.scores else None
        pool = self.pool_scores[max(self.pool_scores)] if self.pool_scores else None
        self.progress_cb(Progress(step, total, phase, pool, last, eta, rss_mb(), *(rows or (None, None))))

    def _evaluate(self, tasks: Sequence[Task]) -> EvalReport:
        """The held-out evaluator over ``tasks``, its rows shown on the live display as they are played
        (at most every ``ROWS_SHOWN_EVERY_S``, and the last), so a long evaluation is seen moving."""
        total, done, shown = len(tasks), 0, time.monotonic()

        def on_row() -> None:
            nonlocal done, shown
            done += 1
            if done == total or time.monotonic() - shown >= ROWS_SHOWN_EVERY_S:
                shown = time.monotonic()
                self._progress(Phase.HELDOUT, self.step, (done, total))

        self._progress(Phase.HELDOUT, self.step, (0, total))
        with counting_rows(on_row):
            return eval_report(self.step, self.heldout_eval(self.step, list(tasks)))

    def _seam_warnings(self, step: int) -> None:
        """A seam's own warnings (the sampler pool taking out a dead server, a reward worker pool
        restarting a worker, a remote rollout worker lost) as warning events."""
        rollout_fns = [p.rollout_fn for p in self.envs.values()]
        for seam in (self.weight_sync, self.advice, *self.rewards.values(), *rollout_fns):
            take = getattr(seam, "take_warnings", None)
            if take is not None and self._recording:
                for warning in take():
                    self.recorder.event(EventKind.WARNING, step, **warning)

    def _mem_peaks(self, *phases: Phase) -> dict[str, float]:
        self.mem.observe_mb(rss_mb(), None)  # the phase's close, also without a watchdog sample in it
        return {f"mem/{k}": v for k, v in self.mem.latest(*phases).items()}

    def _mem_now(self) -> dict[str, float]:
        """This step's ``mem/*`` figures: its sample and train peaks, and the watchdog's last reading."""
        last = self.watchdog.last if self.watchdog is not None else None
        figures = {k: v for k, v in (last.figures() if last is not None else {}).items() if k != "rss_mb"}
        return {**self._mem_peaks(Phase.SAMPLE, Phase.TRAIN), **{f"mem/{k}": v for k, v in figures.items()}}


def _reward_metrics(rollouts: list[Any]) -> dict[str, float]:
    """The mean of each metric environments attached to samples (a Score's components, ``parsed``,
    ``tool_calls``...), over the samples that carry it, as ``reward/<name>``."""
    values: dict[str, list[float]] = {}
    for r in rollouts:
        for key, value in r.metrics.items():
            values.setdefault(key, []).append(value)
    return {f"reward/{key}": mean(v) for key, v in sorted(values.items())}


def _trajectory_metrics(shapes: Sequence[Trajectory]) -> dict[str, float]:
    """Means over the batch's samples: ``rollout/n_turns`` (model turns) and
    ``rollout/trajectory_length`` (tokens of the whole conversation), see :class:`~rlvr.types.Trajectory`."""
    if not shapes:
        return {}
    return {"rollout/n_turns": mean([t.turns for t in shapes]),
            "rollout/trajectory_length": mean([t.tokens for t in shapes])}


def _env_metrics(groups: Iterable[Any]) -> dict[str, float]:
    """``env/<name>/reward`` and ``env/<name>/groups`` per environment, in a run of several."""
    rewards: dict[str, list[float]] = {}
    counts: dict[str, int] = {}
    for g in groups:
        if g.task.env is not None:
            rewards.setdefault(g.task.env, []).extend(g.rewards)
            counts[g.task.env] = counts.get(g.task.env, 0) + 1
    return {**{f"env/{k}/reward": mean(v) for k, v in sorted(rewards.items())},
            **{f"env/{k}/groups": float(n) for k, n in sorted(counts.items())}}


def _by_env(tasks: Iterable[Task], per_task: dict[str, float] | None) -> dict[str, float]:
    """Held-out score per environment (mean over its tasks), in a run of several."""
    if not per_task:
        return {}
    scores: dict[str, list[float]] = {}
    for t in tasks:
        if t.env is not None and t.id in per_task:
            scores.setdefault(t.env, []).append(per_task[t.id])
    return {k: mean(v) for k, v in sorted(scores.items())}


def _std(xs: list[Any]) -> float:
    m = mean(xs)
    return (sum((x - m) ** 2 for x in xs) / len(xs)) ** 0.5 if xs else float("nan")
