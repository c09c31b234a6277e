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

import contextlib
import time
import traceback
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from rlvr.algos import Algorithm
from rlvr.config import GRPOConfig
from rlvr.data.split import SPLIT_BY, rule_of
from rlvr.data.subsample import evaluation_rows
from rlvr.data.tasks import TaskCursor, mean
from rlvr.errors import AbortedError, RecordError, RLLoopError, exception_text, stop_error
from rlvr.lr_schedule import schedule_horizon
from rlvr.protocols import (
    DynamicFilter,
    Environment,
    HeldoutEvaluator,
    RewardFn,
    RolloutFn,
    Sampler,
    Trainer,
    WeightSync,
)
from rlvr.record.checkpoints import recorded_split
from rlvr.record.run_record import EventKind, RunRecord, RunRecorder, checkpoint_name
from rlvr.record.sinks import SinkFanout
from rlvr.reward import reward_callable
from rlvr.rollouts.checks import check_staleness
from rlvr.rollouts.stream import RolloutStream, Route, RowSource, zero_variance_filter
from rlvr.run.advice import RunAdvice
from rlvr.run.checkpointing import load_trainer, prune, selected, write_checkpoint
from rlvr.run.evaluation import evaluate_shown
from rlvr.run.gate import HeldoutGate
from rlvr.run.hooks import current_rl_hooks
from rlvr.run.inputs import (
    EnvPlan,
    LoopOptions,
    LoopSeams,
    carved,
    checked_algorithms,
    group_of,
    stop_all,
    stream_config,
)
from rlvr.run.memory import PhaseTrace, peak_rss_mb, rss_mb
from rlvr.run.resume import open_resumable, pending_rows, reload_record
from rlvr.run.run_info import run_info
from rlvr.run.scores import RunScores
from rlvr.run.step_metrics import StepClock, batch_metrics
from rlvr.types import CheckpointRef, EvalReport, Phase, Progress, Split, StopCause, Task


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
        self.algorithms = checked_algorithms(seams, config)  # refused here, before anything runs
        self.rewards = {name: reward_callable(plan.reward) for name, plan in self.envs.items()}
        self.trainer, self.heldout_eval, self.weight_sync = seams.trainer, seams.heldout_eval, seams.weight_sync
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
        self.scores = RunScores()  # pool, training rows scored like held-out, per environment, eval sets
        # External test sets: scored by heldout_eval beside held-out, recorded, never seen by the gate.
        self.eval_sets = {name: list(tasks) for name, tasks in (options.eval_sets or {}).items()}
        self.step = self.version = 0
        self.mem_trace: dict[str, float] = {}  # per-phase peaks over the run (see PhaseTrace)
        self.mem, self.watchdog = PhaseTrace(), options.watchdog
        self.abort_reason: str | None = None
        self.stop_cause: StopCause | None = None
        self._recording, self._phase_now = False, Phase.SETUP
        self._last_ckpt: int | None = None
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
        plans: dict[str | None, EnvPlan] = (dict(envs) if envs else
                                             {None: EnvPlan(reward, rollout_fn, algorithm, sampler)})  # type: ignore[arg-type]
        seams = LoopSeams(plans, trainer, heldout_eval, weight_sync, dynamic_filter, gauges, closers)
        return cls(config, bench, seams, LoopOptions(**options))

    # ---- public results -------------------------------------------------------------------
    @property
    def heldout_scores(self) -> dict[int, float]:
        return dict(self.gate.scores)

    @property
    def pool_scores(self) -> dict[int, float]:
        return dict(self.scores.pool)

    @property
    def selected_step(self) -> int | None:
        return self.gate.best_step

    @property
    def selected_heldout_score(self) -> float | None:
        return self.gate.best_score

    def summary(self) -> dict[str, Any]:
        """A JSON-serialisable digest of the run (:meth:`~rlvr.run.scores.RunScores.summary`)."""
        return self.scores.summary(self.config, self.gate, self.recorder.metrics, self.step, self.stop_cause)

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
        rule = rule_of(recorded_split(self.out_dir)) if resume and self.out_dir is not None else SPLIT_BY
        split = carved(self.bench, self.config, rule)
        scored = evaluation_rows(split, self.config.heldout_max_rows, self.config.train_eval)
        self.heldout_tasks, self.train_eval_tasks = scored.heldout, scored.train
        self.cursor = TaskCursor(split.train, self.config.seed)
        self._train_by_id = {t.id: t for t in split.train}  # to restore a checkpoint's pending rows
        manifest = {**split.manifest, **scored.manifest}
        routes = {name: Route(group_of(plan, self.config.rollout_timeout_s), self.rewards[name], self.algorithms[name])
                  for name, plan in self.envs.items()}
        self.stream = RolloutStream(routes, stream_config(self.config, self.shaping), self.dynamic_filter)
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
            with contextlib.suppress(RecordError):  # a disk that refused the run: the error raised is the first one
                self.recorder.close()  # a failed run: its lines on disk, its trackers keep what they were given
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
        stop_all(self._closers, self._log)

    def _abort(self, exc: BaseException) -> AbortedError:
        """Stop on purpose: record why and checkpoint if between two steps (mid-step state is
        never saved: the last checkpoint stays the one to resume from); the error to raise."""
        error = stop_error(exc, self.step + 1)
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
        frozen = {id(g) for g in batch.groups if not self.stream.route(g.task).algorithm.samples_from_policy}
        for g in batch.groups:  # frozen-sourced rows (a frozen model's samples) never age
            for r in g.rollouts:
                check_staleness(r, version, cfg.max_head_offpolicy_versions, frozen=id(g) in frozen)
        self._phase(Phase.TRAIN, step)
        assert self.trainer is not None  # checked as the run starts
        metrics = dict(self.trainer(batch) or {})
        t2, busy1 = time.monotonic(), self.stream.busy_seconds()
        self._publish(version + 1)
        t3 = time.monotonic()
        self.step, self.version = step, version + 1
        if not self._last_step():  # no batch is sampled that no step will train (it would slow the last held-out)
            self.stream.trained()
        self.scores.pool[step] = pool = mean(x for g in batch.groups for x in g.rewards)
        clock = StepClock(t0, t1, t2, t3, busy0, busy1, t3 - self._last_step_end)
        self._last_step_end = t3
        self.recorder.event(EventKind.STEP, step, pool_score=pool, version=self.version,
                            task_ids=[g.task.id for g in batch.groups], admitted=batch.admitted,
                            short=len(batch.groups) < cfg.tasks_per_step,
                            filtered=[d.as_dict() for d in batch.filtered],
                            sample_drops=[d.as_dict() for d in batch.sample_drops])
        self.recorder.metric(step, {
            **batch_metrics(batch, version, frozen, self.rows_seen / len(self._train_by_id)),
            **{k: v for k, v in metrics.items() if isinstance(v, (int, float))}, **clock.metrics(batch.scoring_s),
            "mem/rss_mb": rss_mb(), **self.mem.step_figures(self.watchdog.last if self.watchdog else None),
            **self.gauges(),
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
        """Score held-out for the current policy (then, unseen by the gate, the training rows scored
        like it and the external eval sets); True if patience says stop."""
        self._phase(Phase.HELDOUT, self.step)
        report = self._evaluate(self.heldout_tasks)
        decision = self.gate.observe(self.step, report.score)
        by_env = self.scores.heldout_by_env(self.step, self.heldout_tasks, report)
        train = self.scores.score_train(self._evaluate, self.train_eval_tasks, self.step, report.score)
        evals, metrics = self.scores.score_eval_sets(self._evaluate, self.eval_sets, self.step)
        if metrics:
            self.recorder.metric(self.step, metrics)
        self.recorder.event(EventKind.HELDOUT, self.step, score=report.score,
                            n=report.n if report.n is not None else len(self.heldout_tasks),
                            pool_score=self.scores.pool.get(self.step), best_step=decision.best_step,
                            improved=decision.improved, evals_since_best=decision.evals_since_best,
                            **by_env, **train, **evals, **self.mem.closing(Phase.HELDOUT), **self.gauges())
        return decision.stop

    # ---- checkpoints ----------------------------------------------------------------------
    def _checkpoint(self) -> CheckpointRef:
        self._phase(Phase.CHECKPOINT, self.step)
        parent, path = self._last_ckpt, None
        if self.out_dir is not None:
            path = write_checkpoint(self.out_dir, self.step, parent, self.trainer, self.recorder, self._state)
            prune(self.out_dir, self.config.keep_last, self.gate.best_step)
        else:
            self.recorder.event(EventKind.CHECKPOINT, self.step, parent=parent, path=None)
        if self.gate.best_step is not None:
            self._write_selected()  # only now: the published checkpoint must exist on disk
        self._last_ckpt = self.step
        return CheckpointRef(self.step, path, parent)

    def _state(self) -> dict[str, Any]:
        snapshot = self.stream.snapshot()
        admitted = snapshot.pop("admitted")  # this session's count; the state keeps the whole run's
        return {"step": self.step, "version": self.version, "parent": self._last_ckpt, **snapshot,
                "rows_admitted": self._admitted_before + admitted, "gate": self.gate.state(),
                "pool_scores": {str(k): v for k, v in self.scores.pool.items()},
                "stop_cause": self.stop_cause and str(self.stop_cause),
                "record_offsets": self.recorder.offsets(), "seed": self.config.seed}

    def _write_selected(self) -> None:
        self.recorder.write_selected(selected(self.gate, self.scores.pool, self.out_dir is not None))

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
        self.recorder.write_run_info(run_info(self.config, manifest, self.clock(), self._named_seams(),
                                              self.algorithms, self.extra_info))
        self._recording = True
        self.recorder.event(EventKind.START, 0, n_train=manifest["n_train"], n_heldout=manifest["n_heldout"])
        self._heldout()
        self._checkpoint()

    def _restore(self, manifest: dict[str, Any]) -> list[tuple[str, int]]:
        found, run = open_resumable(self.out_dir, self.config, manifest)
        ckpt, state = found.open(lambda c, s: load_trainer(self.trainer, c, s))  # the newest that checks out
        stopped = reload_record(self.recorder, found, ckpt, state, run)
        self.scores.read_events(self.recorder.events)
        self.recorder.sinks.log_config(run)  # this session's trackers start with the run's config
        self.step, self.version, self._last_ckpt = state["step"], state["version"], state["step"]
        self._recording = True
        # Rows admitted and consumed before the checkpoint; its pending rows are admitted again now.
        self._admitted_before = state.get("rows_admitted", 0) - len(state.get("pending", []))
        self.rows_seen = self._admitted_before  # every row admitted and not pending was trained or filtered
        self.cursor.restore(state["cursor"])
        self.gate.restore(state["gate"])
        self.scores.pool = {int(k): v for k, v in state["pool_scores"].items()}
        self.stop_cause = StopCause(state["stop_cause"]) if state["stop_cause"] else None
        if self.stop_cause is StopCause.ABORTED:
            self.stop_cause = None  # an aborted run is resumable: carry on from here
        self._write_selected()  # a crash may have left selected.json ahead of the checkpoints
        self.recorder.event(EventKind.RESUMED, self.step, from_checkpoint=checkpoint_name(self.step),
                            **({"after_abort": stopped[-1].data} if stopped else {}))
        return pending_rows(state, self._train_by_id, found.run_dir)

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
        pool = self.scores.pool[max(self.scores.pool)] if self.scores.pool else None
        self.progress_cb(Progress(step, total, phase, pool, last, eta, rss_mb(), *(rows or (None, None))))

    def _evaluate(self, tasks: Sequence[Task]) -> EvalReport:
        """The held-out evaluator over ``tasks`` at this step, its rows shown on the live display."""
        assert self.heldout_eval is not None  # checked as the run starts
        return evaluate_shown(self.heldout_eval, self.step, tasks, lambda rows: self._progress(Phase.HELDOUT,
                                                                                                  self.step, rows))

    def _seam_warnings(self, step: int) -> None:
        """A seam's own warnings (the sampler pool taking out a dead server, a reward worker pool
        restarting a worker, a remote rollout worker lost) as warning events."""
        rollout_fns = [p.rollout_fn for p in self.envs.values()]
        for seam in (self.weight_sync, self.advice, *self.rewards.values(), *rollout_fns):
            take = getattr(seam, "take_warnings", None)
            if take is not None and self._recording:
                for warning in take():
                    self.recorder.event(EventKind.WARNING, step, **warning)
