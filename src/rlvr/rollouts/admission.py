"""Admission control: which rows may start sampling now, and when a batch may train.

A pure state machine: :meth:`Admission.handle` takes an event and returns the actions to take.
It knows rows only by sequence number; the driver (:mod:`rlvr.rollouts.stream`) owns the rows and the
clock, so every schedule can be replayed in a unit test without threads.

**The rule.** Batch ``w`` is the batch the policy at version ``w`` trains on; it has ``B`` slots
(``rows_per_batch``). A row admitted while the policy is at version ``v`` takes a free slot in the
earliest batch ``w`` with ``v ≤ w ≤ v + O`` (``O = max_offpolicy``; a batch already handed to the
trainer has no free slots), so no trained sample is more than ``O`` versions older than the policy
that trains on it. A filtered row frees its slot for a replacement, but at most
``max_rows_per_batch`` rows are ever admitted for one batch (the oversampling cap; a batch that
becomes current holding nothing, every row it was given ahead having been filtered, starts its
budget afresh, since those rows were judged under an older policy). At most
``max_in_flight`` rows sample at once. Batch ``w`` is handed to the trainer when the policy is at
version ``w``, the consumer is waiting for it, none of its rows are still sampling, and it has
``B`` kept rows or its admission cap is spent (then it trains on what it has, possibly nothing: the
driver decides what that means).
With ``demand_driven`` (synchronous training) rows are admitted only while the consumer waits for
a batch, so nothing samples during a train step, an evaluation or a checkpoint.
With full batches the free-slot count is AReaL's capacity ``(O + v + 1)·B − (accepted + running)``;
on resume the machine starts at the checkpoint's version with empty batches, so it neither bursts
nor starves.
Standard library only.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class Want:
    """The consumer is waiting for its next batch."""


@dataclass(frozen=True, slots=True)
class RowDone:
    """Row ``seq`` finished sampling: ``kept`` into its batch, or filtered (freeing its slot)."""

    seq: int
    kept: bool


@dataclass(frozen=True, slots=True)
class Trained:
    """The batch handed out by the last :class:`Train` was trained: the policy version is +1."""


@dataclass(frozen=True, slots=True)
class Admit:
    """Start sampling row ``seq`` under policy ``version``; it belongs to batch ``batch``."""

    seq: int
    batch: int
    version: int


@dataclass(frozen=True, slots=True)
class Train:
    """Train batch ``version`` on the kept rows ``seqs`` (admission order)."""

    version: int
    seqs: tuple[int, ...]
    admitted: int
    filtered: int


@dataclass(frozen=True, slots=True)
class Poll:
    """Nothing happened; say what may start now (the driver sends it once at start)."""


Event = Poll | Want | RowDone | Trained
Action = Admit | Train


@dataclass(slots=True)
class _Batch:
    admitted: int = 0
    filtered: int = 0
    kept: list[int] = field(default_factory=list)
    sampling: set[int] = field(default_factory=set)


class Admission:
    """The staleness rule above, as events in and actions out."""

    def __init__(self, rows_per_batch: int, max_offpolicy: int = 0, *, max_in_flight: int | None = None,
                 max_rows_per_batch: int | None = None, demand_driven: bool = False, version: int = 0):
        if rows_per_batch < 1 or max_offpolicy < 0 or version < 0:
            raise ValueError("rows_per_batch must be >= 1, max_offpolicy and version >= 0")
        if max_in_flight is not None and max_in_flight < 1:
            raise ValueError("max_in_flight must be >= 1")
        if demand_driven and max_offpolicy:
            raise ValueError("demand-driven (synchronous) admission samples nothing ahead: max_offpolicy must be 0")
        self.rows_per_batch, self.max_offpolicy = rows_per_batch, max_offpolicy
        self.max_in_flight, self.demand_driven = max_in_flight, demand_driven
        self.max_rows_per_batch = max(max_rows_per_batch or rows_per_batch, rows_per_batch)
        self.version, self.next_seq = version, 0
        self.training = self.waiting = False
        self.batches: dict[int, _Batch] = {}
        self.batch_of: dict[int, int] = {}  # sampling row → its batch

    @property
    def in_flight(self) -> int:
        return len(self.batch_of)

    def handle(self, event: Event) -> list[Action]:
        if isinstance(event, RowDone):
            batch = self.batches[self.batch_of.pop(event.seq)]
            batch.sampling.remove(event.seq)
            if event.kept:
                batch.kept.append(event.seq)
            else:
                batch.filtered += 1
        elif isinstance(event, Trained):
            if not self.training:
                raise RuntimeError("Trained without a batch in training")
            self.training = False
            self.batches.pop(self.version, None)
            self.version += 1
            current = self.batches.get(self.version)
            if current is not None and not current.kept and not current.sampling:
                # Everything it was given under older policies was filtered: start its budget afresh.
                self.batches[self.version] = _Batch()
        elif isinstance(event, Want):
            self.waiting = True
        elif not isinstance(event, Poll):
            raise TypeError(f"unknown admission event {event!r}")
        return self._decide()

    def _decide(self) -> list[Action]:
        actions: list[Action] = []
        ready = self._ready() if self.waiting else None  # a batch is handed out only on demand
        if ready is not None:
            actions.append(ready)
            self.training, self.waiting = True, False
        if self.waiting or not self.demand_driven:
            actions.extend(self._admissions())
        return actions

    def _ready(self) -> Train | None:
        if self.training:
            return None
        batch = self.batches.setdefault(self.version, _Batch())
        full = len(batch.kept) >= self.rows_per_batch
        capped = batch.admitted >= self.max_rows_per_batch
        if batch.sampling or not (full or capped):
            return None
        return Train(self.version, tuple(sorted(batch.kept)), batch.admitted, batch.filtered)

    def _free(self, w: int) -> int:
        batch = self.batches.setdefault(w, _Batch())
        slots = self.rows_per_batch - len(batch.kept) - len(batch.sampling)
        return max(0, min(slots, self.max_rows_per_batch - batch.admitted))

    def _admissions(self) -> list[Admit]:
        first = self.version + 1 if self.training else self.version
        targets = range(first, self.version + self.max_offpolicy + 1)
        out: list[Admit] = []
        for w in targets:
            for _ in range(self._free(w)):
                if self.max_in_flight is not None and self.in_flight >= self.max_in_flight:
                    return out
                seq, self.next_seq = self.next_seq, self.next_seq + 1
                self.batches[w].admitted += 1
                self.batches[w].sampling.add(seq)
                self.batch_of[seq] = w
                out.append(Admit(seq, w, self.version))
        return out
