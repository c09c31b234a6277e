"""The rollout stream: rows in, scored and filtered train batches out, sampling in the background.

A thin asyncio driver around :class:`~rlvr.rollouts.admission.Admission`. It runs its own event loop in a
daemon thread, so sampling continues while the caller trains (the caller's thread blocks only in
:meth:`RolloutStream.next_batch`). Per admitted row it runs the group function (``group_k``
samples), checks and scores every sample, drops what cannot be trained on, applies the dynamic
filter, and tells the machine whether the row was kept. Each row goes by its environment's
:class:`Route` (its group function, reward and algorithm): the algorithm credits a scored group
(``credit``: ``assign`` times the algorithm's weight, inside the run's credit shaping,
:mod:`rlvr.rollouts.shaping`), fetches reference log-probs for a kept one
(``score``) and, when the batch is handed out, applies batch statistics to its own groups
(``finalize``). Every admitted row ends in exactly one of: trained (handed out in a batch),
filtered (with a reason, reported with the next batch), or unconsumed when the stream closes
(returned by :meth:`close`). Every sample is stamped with the policy version its row was admitted
under (where its rollout names none), except the rows of an algorithm that samples a frozen model
(``samples_from_policy = False``, e.g. ``sft``): no policy version sampled those, so they carry
none and never age (see :func:`rlvr.rollouts.checks.check_staleness`).

Rewards run in worker threads, off the driver's event loop, each bounded by ``reward_timeout_s``
(a reward that never returns becomes a sample error; its thread is abandoned, so a reward that may
hang should do that work in a process, as :mod:`rlvr.envs.graders.math` does); ``interact`` runs
in a worker thread inside the rollout function, bounded by ``rollout_timeout_s``. A reward is a
function of its conversation and answer: rows are scored concurrently, in no fixed order.
``SystemExit`` or ``KeyboardInterrupt`` raised by user code stops the run with an
:class:`~rlvr.errors.AbortedError`, never a dropped sample.

Samples are handled by ``on_sample_error``: ``"fail"`` stops the run at the first sample whose
rollout or reward raised or returned a non-finite value, naming the row and the exception;
``"drop"`` removes that sample from its group and reports it. A rollout whose tokens do not align
always stops the run: training on misaligned tokens is never an option. A reward of ``None`` means
"does not apply": the sample is dropped and reported.

Each batch carries the shape of its samples (:class:`~rlvr.types.Trajectory`: model turns and
total tokens) and ``scoring_s``, the wall time rows spent being scored (rewards and the
algorithm's reference pass) since the previous batch, overlapping rows counted once.
Standard library only.
"""

from __future__ import annotations

import asyncio
import dataclasses
import queue
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rlvr.errors import AbortedError, BackendError, RewardError, RLLoopError, aborted_by
from rlvr.protocols import DynamicFilter, GroupFn, RewardFn, SampleOutcome
from rlvr.reward import evaluate_rewards_within
from rlvr.rollouts.admission import Admission, Admit, Poll, RowDone, Train, Trained, Want
from rlvr.rollouts.checks import check_rollout
from rlvr.rollouts.shaping import Shaping
from rlvr.seeding import derive_seed
from rlvr.types import Drop, Group, Rollout, StreamBatch, Task, Trajectory

if TYPE_CHECKING:
    from rlvr.algos import Algorithm


def zero_variance_filter(group: Group) -> bool | str:
    """Filter groups whose rewards are all equal: they carry no group-relative signal. A group that
    also learns from a ``ce`` or ``ref_kl`` component (distillation) is never filtered for this."""
    rewards = group.rewards
    if len(set(rewards)) > 1 or any(any(r.ce_weights or ()) or any(r.ref_kl_weights or ()) for r in group.rollouts):
        return True
    return f"zero reward variance (all {rewards[0]:g})"


@dataclass(frozen=True)
class Route:
    """How one environment's rows are sampled (``group_fn``), scored (``reward_fn``) and credited
    (``algorithm``)."""

    group_fn: GroupFn
    reward_fn: RewardFn
    algorithm: Algorithm


class RowSource:
    """Rows to admit, each with its draw index: ``pending`` first (rows a checkpoint left
    unconsumed, with the draw index they had), then the cursor."""

    def __init__(self, cursor: Any, pending: Sequence[tuple[Task, int]] = ()):
        self.cursor, self.pending = cursor, list(pending)

    def take(self) -> tuple[Task, int]:
        return self.pending.pop(0) if self.pending else self.cursor.draw()


@dataclass(frozen=True, slots=True)
class StreamConfig:
    rows_per_batch: int
    group_k: int
    max_offpolicy: int = 0
    synchronous: bool = False
    max_in_flight: int | None = None
    max_rows_per_batch: int | None = None
    min_group_size: int = 1
    on_sample_error: str = "fail"
    seed: int = 0
    reward_timeout_s: float | None = None
    shaping: Shaping = dataclasses.field(default_factory=Shaping)  # around every group's credit


class RolloutStream:
    """Admission-controlled sampling in a background thread; see the module docstring."""

    def __init__(self, routes: Mapping[str | None, Route], config: StreamConfig,
                 dynamic_filter: DynamicFilter | None = None):
        if config.on_sample_error not in ("fail", "drop"):
            raise RLLoopError(f"on_sample_error must be 'fail' or 'drop', got {config.on_sample_error!r}")
        self.routes = dict(routes)
        self.config, self.dynamic_filter = config, dynamic_filter
        self._out: queue.Queue = queue.Queue()
        self._busy_lock = threading.Lock()
        self._busy_total, self._sampling = 0.0, 0
        self._busy_since: float | None = None
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    # ---- caller's thread ------------------------------------------------------------------
    def start(self, source: RowSource, version: int) -> None:
        c = self.config
        self.source = source
        self.machine = Admission(c.rows_per_batch, c.max_offpolicy, max_in_flight=c.max_in_flight,
                                 max_rows_per_batch=c.max_rows_per_batch, demand_driven=c.synchronous,
                                 version=version)
        self.rows: dict[int, Task] = {}  # admitted, not yet trained or filtered
        self.draws: dict[int, int] = {}  # their draw indices: the coordinate their seeds derive from
        self.kept: dict[int, Group] = {}
        self.kept_tasks: dict[int, Task] = {}
        self.kept_shapes: dict[int, tuple[Trajectory, ...]] = {}  # each kept row's samples (n_turns, length)
        self.scoring: list[tuple[float, float]] = []  # (start, end) of each scoring pass since the last batch
        self.tasks: dict[int, asyncio.Task] = {}
        self.filtered: list[Drop] = []
        self.sample_drops: list[Drop] = []
        self.finished = 0
        self.failed: BaseException | None = None
        started = threading.Event()
        self._thread = threading.Thread(target=self._serve, args=(started,), name="rlvr-rollouts", daemon=True)
        self._thread.start()
        started.wait()
        self._post(Poll())

    def next_batch(self) -> StreamBatch:
        """Block until the machine hands out the next batch (or the stream failed)."""
        self._post(Want())
        while True:
            try:
                item = self._out.get(timeout=0.5)
            except queue.Empty:
                if self._thread is None or not self._thread.is_alive():
                    raise RLLoopError("the rollout stream stopped unexpectedly") from None
                continue
            if isinstance(item, BaseException):
                raise item
            return item

    def trained(self) -> None:
        """The last batch was trained and the sampler serves the new version."""
        self._post(Trained())

    def snapshot(self) -> dict[str, Any]:
        """Rows admitted but not consumed (in admission order) and the cursor: what a resume
        must sample first and where it continues. Taken on the driver's thread, consistently."""
        return self._on_loop(self._snapshot)

    def busy_seconds(self) -> float:
        """Total time with at least one row sampling (for the overlap metric)."""
        with self._busy_lock:
            open_ = time.monotonic() - self._busy_since if self._busy_since is not None else 0.0
            return self._busy_total + open_

    def close(self) -> dict[str, Any]:
        """Stop sampling. What is left: ``unconsumed`` (ids of rows admitted and never trained or
        filtered, in admission order), ``filtered`` (rows filtered since the last batch) and the
        number of rows ``admitted`` since start, and the ``sample_drops`` since the last batch."""
        if self._loop is None or self._thread is None or not self._thread.is_alive():
            return {"unconsumed": [], "filtered": [], "sample_drops": [], "admitted": 0}
        left = self._on_loop(self._cancel_all)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=30)
        return left

    def _post(self, event: Any) -> None:
        assert self._loop is not None, "start() the stream first"
        self._loop.call_soon_threadsafe(self._handle, event)

    def _on_loop(self, fn: Callable[[], Any], timeout_s: float = 300.0) -> Any:
        done: queue.Queue = queue.Queue()
        self._loop.call_soon_threadsafe(lambda: done.put(fn()))  # type: ignore[union-attr]
        try:
            return done.get(timeout=timeout_s)
        except queue.Empty:
            raise RLLoopError(f"the rollout stream did not answer within {timeout_s:g}s: a reward function or a "
                              "rollout function is blocking its event loop (run slow work in a thread or "
                              "process, as the math and tools environments do)") from None

    # ---- driver thread --------------------------------------------------------------------
    def _serve(self, started: threading.Event) -> None:
        self._loop = asyncio.new_event_loop()
        asyncio.set_event_loop(self._loop)
        started.set()
        try:
            self._loop.run_forever()
            left = asyncio.all_tasks(self._loop)  # cancelled by close(): let them unwind
            for task in left:
                task.cancel()
            if left:
                self._loop.run_until_complete(asyncio.gather(*left, return_exceptions=True))
        finally:
            self._loop.close()

    def _snapshot(self) -> dict[str, Any]:
        pending = [(self.rows[s], self.draws[s]) for s in sorted(self.rows)] + self.source.pending
        return {"pending": [t.id for t, _ in pending], "pending_draws": [d for _, d in pending],
                "cursor": self.source.cursor.state(), "admitted": self.machine.next_seq}

    def _cancel_all(self) -> dict[str, Any]:
        self.failed = self.failed or RLLoopError("stream closed")
        for task in self.tasks.values():
            task.cancel()
        return {"unconsumed": [self.rows[s].id for s in sorted(self.rows)],
                "filtered": [d.as_dict() for d in self.filtered],
                "sample_drops": [d.as_dict() for d in self.sample_drops], "admitted": self.machine.next_seq}

    def _handle(self, event: Any) -> None:
        if self.failed is not None:
            return
        try:
            actions = self.machine.handle(event)
        except Exception as exc:  # noqa: BLE001 - the driver thread reports every failure to the loop
            self._fail(exc)
            return
        try:
            for action in actions:
                if isinstance(action, Admit):
                    self._admit(action)
                elif isinstance(action, Train):
                    self._hand_out(action)  # runs the algorithms' batch-time pass: may raise
        except Exception as exc:  # noqa: BLE001 - the driver thread reports every failure to the loop
            self._fail(exc)

    def _admit(self, action: Admit) -> None:
        task, draw = self.source.take()
        self.rows[action.seq], self.draws[action.seq] = task, draw
        self._set_busy(+1)
        sampling = self._sample(action.seq, task, draw, action.version)
        self.tasks[action.seq] = self._loop.create_task(sampling)  # type: ignore[union-attr]

    def route(self, task: Task) -> Route:
        try:
            return self.routes[task.env]
        except KeyError:
            raise RLLoopError(f"row {task.id!r} belongs to environment {task.env!r}, which the run does not have "
                              f"(it has {sorted(map(str, self.routes))})") from None

    def _hand_out(self, action: Train) -> None:
        groups = _finalized([self.kept.pop(s) for s in action.seqs], [self.route(self.kept_tasks.pop(s)).algorithm
                                                                      for s in action.seqs])
        for s in action.seqs:
            del self.rows[s], self.draws[s]
        shapes = tuple(t for s in action.seqs for t in self.kept_shapes.pop(s))
        batch = StreamBatch(action.version + 1, groups, action.admitted, tuple(self.filtered),
                            tuple(self.sample_drops), self.finished, shapes, covered(self.scoring))
        self.filtered, self.sample_drops, self.finished, self.scoring = [], [], 0, []
        self._out.put(batch)

    async def _sample(self, seq: int, task: Task, draw: int, version: int) -> None:
        k, seed = self.config.group_k, self.config.seed
        try:
            try:
                # A sample's seed is a function of its coordinates (run seed, the row's content, draw,
                # sample index), never of timing (the version a row is admitted under can vary when
                # sampling runs ahead) nor of the row's id: the same rows draw the same samples
                # whatever they are called, so two runs over renamed rows compare draw for draw.
                outcomes = await self.route(task).group_fn(
                    task, k, version, lambda i: derive_seed(seed, "rollout", task.content_hash, draw, i))
            except (RLLoopError, BackendError):
                raise  # a broken contract (wrong shapes) or a failed backend (stale server): never dropped
            except Exception as exc:  # noqa: BLE001 - the row as a whole failed: every sample carries why
                outcomes = [exc] * k  # the row as a whole failed: every sample carries why
            group, shapes, reason, drops = await self._assemble(task, version, outcomes)
        except asyncio.CancelledError:
            raise
        except (SystemExit, KeyboardInterrupt) as exc:  # raised by user code: stop the run, resumably
            self._fail(aborted_by(exc, f"row {task.id!r}"))
            return
        except BaseException as exc:  # noqa: BLE001 - the driver thread reports every failure to the loop
            self._fail(exc)
            return
        finally:
            self.tasks.pop(seq, None)
            self._set_busy(-1)
        self.finished += 1
        self.sample_drops.extend(drops)  # recorded with the row's outcome, never half of a row
        if group is None:
            del self.rows[seq], self.draws[seq]
            self.filtered.append(Drop(task.id, reason or "filtered"))
        else:
            self.kept[seq], self.kept_tasks[seq], self.kept_shapes[seq] = group, task, shapes
        self._handle(RowDone(seq, kept=group is not None))

    async def _assemble(self, task: Task, version: int, outcomes: Sequence[SampleOutcome]
                        ) -> tuple[Group | None, tuple[Trajectory, ...], str | None, list[Drop]]:
        """Check, score and filter one row's samples: a group and its samples' shapes (or ``None`` and
        the reason), and the samples dropped on the way."""
        drops: list[Drop] = []
        frozen = not self.route(task).algorithm.samples_from_policy  # a frozen model's rows carry no version
        # Every sample is checked before any is scored: a broken contract stops the run at once.
        episodes: list[tuple[int, list[Rollout]]] = []  # each sample: one rollout, or an episode's segments
        for i, outcome in enumerate(outcomes):
            if outcome is None:
                drops.append(Drop(task.id, "rollout function returned None", i))
            elif isinstance(outcome, AbortedError):
                raise outcome  # user code asked to stop: never a dropped sample
            elif isinstance(outcome, BaseException):
                problem = f"rollout raised {type(outcome).__name__}: {outcome}"
                self._sample_error(task, i, problem, outcome)
                drops.append(Drop(task.id, problem, i))
            else:
                segments = list(outcome) if isinstance(outcome, (list, tuple)) else [outcome]
                if not segments or not all(isinstance(r, Rollout) for r in segments):
                    raise RLLoopError(f"row {task.id!r} sample {i}: a rollout function must return a Rollout, a "
                                      f"non-empty list of Rollouts (segments) or None, got {outcome!r:.200}")
                for r in segments:
                    check_rollout(r, task)  # misaligned tokens always stop the run
                episodes.append((i, [stamped(r, None if frozen else version) for r in segments]))
        samples: list[list[Rollout]] = []
        start = time.monotonic()
        scores = await self._score(task, [(i, segments[-1]) for i, segments in episodes])  # each final conversation
        self.scoring.append((start, time.monotonic()))
        for (i, segments), (scored, why) in zip(episodes, scores, strict=True):
            if scored is not None:  # one episode, one score
                samples.append([dataclasses.replace(r, reward=scored.reward, metrics=scored.metrics)
                                for r in segments[:-1]] + [scored])
            if why is not None:
                drops.append(Drop(task.id, why, i))
        if len(samples) < self.config.min_group_size:
            return None, (), (f"{len(samples)} of {len(outcomes)} samples usable, below "
                              f"min_group_size={self.config.min_group_size}"), drops
        algorithm = self.route(task).algorithm
        group = self.config.shaping.credit(algorithm, task, samples)
        if self.dynamic_filter is not None:
            verdict = self.dynamic_filter(group)
            if verdict is not True:
                return None, (), verdict if isinstance(verdict, str) and verdict else "dynamic filter", drops
        start = time.monotonic()
        credited = await algorithm.score(group)  # the reference's log-probs, for the algorithms that need them
        self.scoring.append((start, time.monotonic()))
        return credited, tuple(Trajectory.of(s) for s in samples), None, drops

    async def _score(self, task: Task, finals: list[tuple[int, Rollout]]) -> list[tuple[Rollout | None, str | None]]:
        """Each sample scored (or ``None`` and why): the group's rewards in one thread hand-off, off the
        event loop and each bounded (a slow or hung reward never stalls the stream)."""
        # Scored by the rollout function itself: still only a finite number is a reward.
        calls = [(self.route(task).reward_fn if r.reward is None else _given(r.reward), list(r.messages), task.answer,
                  task) for _, r in finals]
        results = await asyncio.to_thread(evaluate_rewards_within, calls, self.config.reward_timeout_s)
        out: list[tuple[Rollout | None, str | None]] = []
        for (i, r), result in zip(finals, results, strict=True):
            if isinstance(result, RewardError):
                self._sample_error(task, i, str(result), result)
                out.append((None, str(result)))
            elif result.value is None:
                out.append((None, "reward does not apply (None)"))
            else:
                out.append((dataclasses.replace(r, reward=result.value, metrics={**r.metrics, **result.metrics}), None))
        return out

    def _sample_error(self, task: Task, i: int, problem: str, exc: BaseException | None) -> None:
        if self.config.on_sample_error == "fail":
            error = RLLoopError(f"row {task.id!r} sample {i}: {problem} (set on_sample_error = 'drop' "
                                "to count and skip such samples)")
            raise error from exc

    def _fail(self, exc: BaseException) -> None:
        if self.failed is None:
            self.failed = exc
            self._out.put(exc)

    def _set_busy(self, delta: int) -> None:
        with self._busy_lock:
            now, before = time.monotonic(), self._sampling
            self._sampling += delta
            if before == 0 and self._sampling > 0:
                self._busy_since = now
            elif before > 0 and self._sampling == 0:
                self._busy_total += now - self._busy_since if self._busy_since is not None else 0.0
                self._busy_since = None


def _finalized(groups: list[Group], algorithms: list[Algorithm]) -> tuple[Group, ...]:
    """The batch after each algorithm's batch-time pass over its own groups, in the batch's order."""
    out = list(groups)
    for algorithm in {id(a): a for a in algorithms}.values():
        mine = [i for i, a in enumerate(algorithms) if a is algorithm]
        for i, g in zip(mine, algorithm.finalize([groups[i] for i in mine]), strict=True):
            out[i] = g
    return tuple(out)


def covered(spans: Sequence[tuple[float, float]]) -> float:
    """Seconds covered by at least one of ``spans``: rows scored at once count their overlap once."""
    total, reach = 0.0, float("-inf")
    for start, end in sorted(spans):
        if end > reach:
            total += end - max(start, reach)
            reach = end
    return total


def stamped(r: Rollout, version: int | None) -> Rollout:
    """``r`` with the policy version it was admitted under where it names none; ``version=None`` (a
    frozen-sourced row: no policy sampled it) clears whatever version it carries, so it never ages."""
    if version is None:
        return r if r.version is None else dataclasses.replace(r, version=None)
    return r if r.version is not None else dataclasses.replace(r, version=version)


def _given(value: Any) -> Callable[..., Any]:
    def rollout_reward(messages: Any, answer: Any) -> Any:
        return value

    return rollout_reward
