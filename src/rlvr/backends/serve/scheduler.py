"""How ``rlvr serve`` shares the model between clients: decode steps interleaved per request.

Every sample of every request is a :class:`Job`. The scheduler runs slices
(:func:`~rlvr.backends.serve.decoding.decode_slice`) on the engine's worker thread: each slice takes
up to ``max_batch`` jobs in turn from every waiting request (one of each, then a second of each,
...), runs the rows with few tokens to go first, and yields after ``slice_s`` seconds (and at least
one decode step) as soon as a request with no job in the slice is waiting; unfinished jobs go back
to the queue and resume where they stopped. So a 2-token request beside an ``n=256,
max_tokens=200`` one waits about one slice, not the whole request, and a row's token reaches its
request (and a stream's client) in the step that sampled it.

Invariants:
- A job's tokens all come from one policy version: a model change (:meth:`Scheduler.paused`)
  lets the jobs already started finish, starts no new one meanwhile, and runs with nothing in flight.
- A job resolves with its :class:`Completion` as soon as its row stops (stop token or budget), while
  the rest of its slice goes on; a cancelled job (its client went away) stops at the next step.
- Prompt log-prob jobs (vLLM's ``prompt_logprobs``) are scored in their request's turn, under the
  same lock as generation.

A backend module: imports torch (through the decoding slice).
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from rlvr.backends.serve.decoding import Row, TokenEvent, decode_slice
from rlvr.types import Completion, SamplingParams, StopReason

SLICE_S = 0.1  # seconds a slice runs before it yields to a waiting request (at least one decode step)
SHORT = 16  # rows with at most this many tokens to go run before the longer rows of their turn


@dataclass(eq=False)
class Job:
    """One sample: its prompt, setup, and what it has generated so far (read on the event loop)."""

    request: int
    adapter: str | None
    prompt: tuple[int, ...]
    params: SamplingParams | None  # None: a prompt log-prob job
    seed: int
    top_n: int
    future: asyncio.Future
    ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    tops: list[list[tuple[int, float]]] = field(default_factory=list)
    version: int | None = None
    started: bool = False
    cancelled: bool = False
    listener: Callable[[Job, str | None], None] | None = None  # a stream: called after every token

    @property
    def done(self) -> bool:
        return self.future.done() or self.cancelled

    def row(self) -> Row:
        assert self.params is not None
        return Row(self.prompt + tuple(self.ids), self.seed, len(self.ids), self.params.max_tokens - len(self.ids))


class Scheduler:
    """The queue of jobs and the loop that runs their slices, for one :class:`ModelHost`."""

    def __init__(self, host: Any, *, max_batch: int, slice_s: float = SLICE_S):
        self.host, self.max_batch, self.slice_s = host, max_batch, slice_s
        self.pending: list[Job] = []
        self.requests = 0
        self.lock = asyncio.Lock()
        self._pausing = 0
        self._drainer: asyncio.Task | None = None

    def submit(self, adapter: str | None, jobs: Sequence[tuple[Sequence[int], SamplingParams | None, int]], *,
               top_n: int = 0, listener: Callable[[Job, str | None], None] | None = None) -> list[Job]:
        """Queue one request's jobs (prompt, params or ``None`` to score the prompt, seed)."""
        loop = asyncio.get_running_loop()
        self.requests += 1
        made = [Job(self.requests, adapter, tuple(p), params, seed, top_n, loop.create_future(), listener=listener)
                for p, params, seed in jobs]
        self.pending += made
        self.kick()
        return made

    def kick(self) -> None:
        if self._drainer is None or self._drainer.done():
            self._drainer = asyncio.ensure_future(self._drain())  # next loop turn: this turn's requests join

    def _next_batch(self) -> list[Job]:
        """Up to ``max_batch`` jobs, taken in turn from each waiting request; while a model change
        waits, only jobs already started."""
        self.pending = [j for j in self.pending if not j.done]
        candidates = [j for j in self.pending if j.started] if self._pausing else self.pending
        by_request: dict[int, list[Job]] = {}
        for job in candidates:
            by_request.setdefault(job.request, []).append(job)
        queues = list(by_request.values())
        batch: list[Job] = []
        depth = 0
        while len(batch) < self.max_batch and any(depth < len(q) for q in queues):
            batch += [q[depth] for q in queues if depth < len(q)][: self.max_batch - len(batch)]
            depth += 1
        chosen = set(map(id, batch))
        self.pending = [j for j in self.pending if id(j) not in chosen]
        return batch

    async def _drain(self) -> None:
        while batch := self._next_batch():
            by_adapter: dict[str | None, list[Job]] = {}
            for job in batch:
                by_adapter.setdefault(job.adapter, []).append(job)
            async with self.lock:
                for adapter, jobs in by_adapter.items():
                    try:
                        await self._turn(adapter, jobs)
                    except Exception as exc:  # noqa: BLE001 - every waiter hears about it; the server keeps serving
                        for job in jobs:
                            if not job.future.done():
                                job.future.set_exception(exc)
                            if job.listener is not None:
                                job.listener(job, None)
            # Unfinished jobs go back in request order, ahead of nothing they were behind.
            back = [j for j in batch if not j.done]
            self.pending = sorted(back + self.pending, key=lambda j: j.request)

    async def _turn(self, adapter: str | None, jobs: list[Job]) -> None:
        host = self.host
        host.select(adapter)
        version = host.current_version
        for job in jobs:
            if job.params is None:
                continue
            job.started = True
            job.version = version if job.version is None else job.version
        for job in [j for j in jobs if j.params is None and not j.done]:
            scored = await host.engine.score_with_ranks(job.prompt[:1], job.prompt[1:])
            if not job.future.done():  # its client may have gone meanwhile
                job.future.set_result((scored, version))
        groups: dict[tuple[SamplingParams, bool], list[Job]] = {}
        for job in jobs:
            if job.params is not None:
                key = (dataclasses.replace(job.params, max_tokens=1), job.row().budget > SHORT)
                groups.setdefault(key, []).append(job)
        # Short work first: a request of a few tokens is answered before long rows of the same turn.
        for (params, long), group in sorted(groups.items(), key=lambda g: g[0][1]):
            # Long rows yield to the queue and to the turn's other rows; short ones finish first.
            beside = [j for j in jobs if j.params is not None and all(j is not g for g in group)]
            await host.engine.call(self._slice_fn(params, group, beside if long else None,
                                                  asyncio.get_running_loop()))

    def _slice_fn(self, params: SamplingParams, jobs: list[Job], beside: list[Job] | None,
                  loop: asyncio.AbstractEventLoop) -> Callable[[], Any]:
        """The slice of ``jobs`` to run on the worker; it yields to the queue and to ``beside`` (the
        turn's other jobs, whose own slices come before or after it), never when ``beside`` is
        ``None`` (rows of at most ``SHORT`` tokens to go: they end within a few steps)."""
        rows = [j.row() for j in jobs]
        requests = {j.request for j in jobs}
        engine = self.host.engine

        def on_token(event: TokenEvent) -> None:
            loop.call_soon_threadsafe(self._token, jobs[event[0]], event)

        def yield_now() -> bool:  # another request waits (read from the worker thread: a snapshot)
            return beside is not None and time.monotonic() - started[0] >= self.slice_s and any(
                j.request not in requests and not j.done for j in list(self.pending) + beside)

        started = [0.0]

        def run() -> None:
            engine.batches += 1
            started[0] = time.monotonic()
            decode_slice(engine.model, rows, params, eos_ids=engine.eos_ids, pad_id=engine.pad_id,
                         top_n=max(j.top_n for j in jobs), on_token=on_token, cancelled=lambda i: jobs[i].done,
                         yield_now=yield_now, share_prompts=engine.share_prompts)
        return run

    def _token(self, job: Job, event: TokenEvent) -> None:
        _, token, logprob, top, reason = event
        if job.done:
            return
        job.ids.append(token)
        job.logprobs.append(logprob)
        if top is not None:
            job.tops.append(top[: job.top_n])
        if reason is not None:
            stop = StopReason.STOP if reason == "stop" else StopReason.LENGTH
            job.future.set_result((Completion(tuple(job.ids), tuple(job.logprobs), stop, job.version), job.version))
        if job.listener is not None:
            job.listener(job, reason)

    @asynccontextmanager
    async def paused(self) -> AsyncIterator[None]:
        """Hold the model with nothing in flight: started jobs finish first, no new one starts."""
        self._pausing += 1
        try:
            while any(j.started and not j.done for j in self.pending) or self.lock.locked():
                await asyncio.sleep(0.005)
            async with self.lock:
                yield
        finally:
            self._pausing -= 1
            if self.pending:
                self.kick()
