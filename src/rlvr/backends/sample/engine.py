"""The in-process generation engine: a :class:`~rlvr.rollouts.episodes.Generator` over a transformers model.

Generation runs in the engine's own worker thread, so sampling overlaps a train step on the
caller's thread (torch releases the GIL inside its kernels). Concurrent ``generate`` calls are
batched: every request made during one turn of the caller's event loop goes to the worker as one
batch, so the default rollout function (one request per sample, all submitted together) costs one
``model.generate`` per step, as a batch sampler would. Each request's draw comes from its own seed
(:class:`~rlvr.backends.sample.batched.SeededDraw`), so a completion depends on its prompt and
seed only, never on which other requests shared its batch.

Generation is serialised per device: every engine holds its device's gate
(:mod:`~rlvr.backends.sample.gate`) for each batch it generates or scores, so the held-out
evaluator's engine and the rollout engine never run two ``generate`` calls at once on one device;
the gate counts how long each waited. With ``compile`` the engine decodes with a static KV cache
and the compiled forward (:mod:`~rlvr.backends.sample.compiled`).

Weights: the engine samples either from the live model (``version`` a callable reading the live
policy's version; safe when nothing trains while it samples, i.e. ``max_head_offpolicy_versions =
0``) or from its own replica, updated by :meth:`publish` at version boundaries: the copy is taken
on the caller's thread (after the train step, before sampling may use the new version) and loaded
by the worker between two batches, so no batch mixes weights and every completion carries the
version that produced it.

Scoring (:meth:`InProcessEngine.score`, the :class:`~rlvr.protocols.Scorer` seam: the policy's own
log-probs of given tokens, at temperature 1) runs on the same worker, so it is serialised with
generation and weight loads; the scores requested in one loop turn share forward passes, each pass
bounded to ``SCORE_TOKENS`` padded tokens. The numbers are
:func:`~rlvr.backends.model.io.token_logprobs`'s, the trainer's own definition.

A backend module: imports torch.
"""

from __future__ import annotations

import asyncio
import copy
import queue
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from rlvr.backends.exit_wait import hold_exit
from rlvr.backends.model.io import position_features, scored_positions, spread
from rlvr.backends.sample.batched import sample_batch
from rlvr.backends.sample.compiled import prepare_thread
from rlvr.backends.sample.futures import resolve
from rlvr.backends.sample.gate import DeviceGate, gate_for
from rlvr.errors import BackendError
from rlvr.types import Completion, SamplingParams


@dataclass(slots=True)
class _Request:
    prompt: tuple[int, ...]
    params: SamplingParams
    seed: int
    future: asyncio.Future
    loop: asyncio.AbstractEventLoop


@dataclass(slots=True)
class _Score:
    prompt: tuple[int, ...]
    completion: tuple[int, ...]
    ranks: bool  # also each token's rank (1 = the most likely), as vLLM's prompt_logprobs report it
    future: asyncio.Future
    loop: asyncio.AbstractEventLoop


# The worker's jobs, in the order they were queued: a loop turn's requests, a function to run on the
# worker, a weight load, the stop.
@dataclass(frozen=True, slots=True)
class _Batch:
    requests: list[_Request | _Score]


@dataclass(frozen=True, slots=True)
class _Call:
    fn: Callable[[], Any]
    future: asyncio.Future
    loop: asyncio.AbstractEventLoop


@dataclass(frozen=True, slots=True)
class _Load:
    weights: dict[str, torch.Tensor]
    version: int


@dataclass(frozen=True, slots=True)
class _Stop:
    pass


_Job = _Batch | _Call | _Load | _Stop

SCORE_TOKENS = 1 << 12  # padded tokens per scoring forward pass: its logits are [tokens, vocab] at once


class InProcessEngine:
    """``await engine.generate(prompt_ids, params, seed=...)`` from any asyncio loop. ``model``: a
    transformers causal LM, or what stands for one (``generate``, ``parameters``, ``eval``, ``config``)."""

    def __init__(self, model: Any, *, eos_ids: set[int], pad_id: int,
                 version: int | None | Callable[[], int | None] = 0, max_batch: int = 512, name: str = "rlvr-engine",
                 share_prompts: bool = True, compile: bool = False, gate: DeviceGate | None = None):
        self.model, self.eos_ids, self.pad_id, self.max_batch = model, set(eos_ids), pad_id, max_batch
        self.share_prompts = share_prompts  # a prompt repeated in a batch is read once (backends/sample/prefix.py)
        self.compile, self.name = compile, name
        # Shared with every other engine on this device: one generate at a time there.
        self.gate = gate if gate is not None else gate_for(next(model.parameters()).device)
        self._version = version
        self._pending: list[_Request | _Score] = []
        self._lock = threading.Lock()
        self._jobs: queue.SimpleQueue[_Job] = queue.SimpleQueue()
        self.batches = 0  # generate calls made, for tests and benchmarks
        self._broken: Exception | None = None
        self._closing = threading.Event()
        self._thread = threading.Thread(target=self._work, name=name, daemon=True)
        self._thread.start()
        hold_exit(self, self._thread, InProcessEngine._stop)  # never left in a forward pass at exit

    @classmethod
    def replica_of(cls, policy: Any, **kwargs: Any) -> InProcessEngine:
        """An engine over a private copy of ``policy.model`` at ``policy.version``."""
        model = copy.deepcopy(policy.model).eval()
        model.requires_grad_(False)
        return cls(model, eos_ids=policy.eos_ids, pad_id=policy.tokenizer.pad_token_id,
                   version=policy.version, **kwargs)

    @property
    def version(self) -> int | None:  # None: a server's model of no known policy version
        return self._version() if callable(self._version) else self._version

    async def generate(self, prompt_ids: Sequence[int], params: SamplingParams, *, seed: int) -> Completion:
        if not prompt_ids:
            raise BackendError("generate: empty prompt")
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        self._submit(_Request(tuple(prompt_ids), params, seed, future, loop), loop)
        return await future

    async def score(self, prompt_ids: Sequence[int], completion_ids: Sequence[int]) -> list[float]:
        """``log p(completion_ids[t] | prompt_ids + completion_ids[:t])`` for every t, at temperature 1,
        under the weights the engine samples from now (the :class:`~rlvr.protocols.Scorer` seam)."""
        logprobs, _ = await self.score_with_ranks(prompt_ids, completion_ids, ranks=False)
        return logprobs

    async def score_with_ranks(self, prompt_ids: Sequence[int], completion_ids: Sequence[int], *,
                               ranks: bool = True) -> tuple[list[float], list[int]]:
        """:meth:`score` and, with ``ranks``, each token's rank in its position's distribution (1 = the
        most likely; ties count against the token, as vLLM counts them); ``[]`` ranks otherwise."""
        if not prompt_ids:
            raise BackendError("score: empty prompt (the first token has no context to be scored in)")
        if not completion_ids:
            return [], []
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        self._submit(_Score(tuple(prompt_ids), tuple(completion_ids), ranks, future, loop), loop)
        return await future

    def _submit(self, request: _Request | _Score, loop: asyncio.AbstractEventLoop) -> None:
        with self._lock:
            first = not self._pending
            self._pending.append(request)
        if first:
            loop.call_soon(self._flush)  # after every request of this loop turn has been made

    def _flush(self) -> None:
        with self._lock:
            batch, self._pending = self._pending, []
        if batch:
            self._jobs.put(_Batch(batch))

    async def call(self, fn: Callable[[], Any]) -> Any:
        """Run ``fn()`` on the worker thread, holding the device's gate, between two batches (a
        server's own decoding loop, so it too is serialised with every generate on this device)."""
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        self._jobs.put(_Call(fn, future, loop))
        return await future

    def publish(self, weights: dict[str, torch.Tensor], version: int) -> int:
        """Serve ``weights`` (name → tensor, e.g. the trainable ones) from the next batch on.
        Requests made after this call are answered by ``version`` or later."""
        if callable(self._version):
            raise BackendError("this engine samples the live model; it has no replica to publish to")
        copies = {name: w.detach().clone() for name, w in weights.items()}
        self._jobs.put(_Load(copies, version))
        return version

    def close(self) -> None:
        """Stop the worker: a batch under way ends at its next token, the jobs queued behind it are
        answered with an error, and the thread is gone when this returns (within seconds; a forward pass
        longer than the wait here finishes on its own, and the interpreter's exit waits for it:
        :mod:`rlvr.backends.exit_wait`)."""
        self._stop()
        self._thread.join(timeout=30)

    def _stop(self) -> None:
        self._closing.set()
        self._jobs.put(_Stop())

    # ---- worker thread --------------------------------------------------------------------
    def _work(self) -> None:
        if self.compile:
            prepare_thread()  # CUDA graph trees keep per-thread state
        while True:
            job = self._jobs.get()
            if isinstance(job, _Stop):
                return
            if isinstance(job, _Load):
                try:
                    self._load(job.weights, job.version)
                except Exception as exc:  # noqa: BLE001 - answered to every later request, never lost in this thread
                    self._broken = exc
            elif isinstance(job, _Call):
                self._call(job.fn, job.future, job.loop)
            else:
                self._run(job.requests)

    def _call(self, fn: Callable[[], Any], future: asyncio.Future, loop: asyncio.AbstractEventLoop) -> None:
        try:
            with self.gate.hold(self.name):
                result: Any = fn()
        except Exception as exc:  # noqa: BLE001 - answered to the caller, never lost in this thread
            result = exc
        try:
            loop.call_soon_threadsafe(resolve, future, result)
        except RuntimeError:  # the caller's loop closed meanwhile
            pass

    def _load(self, weights: dict[str, torch.Tensor], version: int) -> None:
        params = dict(self.model.named_parameters())
        missing = sorted(set(weights) - set(params))
        if missing:
            raise BackendError(f"engine replica has no parameter(s) {missing[:3]}")
        with torch.no_grad():
            for name, w in weights.items():
                params[name].copy_(w)
        self._version = version

    def _run(self, batch: list[_Request | _Score]) -> None:
        by_params: dict[SamplingParams, list[_Request]] = {}
        scores: list[_Score] = []
        for request in batch:
            if isinstance(request, _Score):
                scores.append(request)
            else:
                by_params.setdefault(request.params, []).append(request)
        for params, requests in by_params.items():
            for start in range(0, len(requests), self.max_batch):
                self._generate(params, requests[start:start + self.max_batch])
        for chunk in _score_chunks([r for r in scores if not r.future.cancelled()], self.max_batch):
            self._score(chunk)

    def _generate(self, params: SamplingParams, requests: list[_Request]) -> None:
        live = [r for r in requests if not r.future.cancelled()]
        if not live:
            return

        def abandoned() -> bool:  # read once a token: every caller gone (timed out), or the engine closing
            return self._closing.is_set() or all(r.future.cancelled() for r in live)

        try:
            if self._broken is not None:
                raise BackendError(f"engine weights could not be loaded: {self._broken}") from self._broken
            if self._closing.is_set():
                raise BackendError(f"engine {self.name!r} was closed before this request was generated")
            with self.gate.hold(self.name):
                version = self.version
                outs = sample_batch(self.model, [r.prompt for r in live], params, seed=[r.seed for r in live],
                                    eos_ids=self.eos_ids, pad_id=self.pad_id, share_prompts=self.share_prompts,
                                    compiled=self.compile, abandoned=abandoned)
            self.batches += 1
            results: list[Any] = [Completion(o.ids, o.logprobs, o.stop_reason, version) for o in outs]
        except Exception as exc:  # noqa: BLE001 - every waiter hears about it; the engine keeps serving
            results = [exc] * len(live)
        _answer(live, results)

    def _score(self, requests: list[_Score]) -> None:
        """One forward pass over ``requests`` (right-padded), read back per request."""
        try:
            if self._broken is not None:
                raise BackendError(f"engine weights could not be loaded: {self._broken}") from self._broken
            with self.gate.hold(self.name):
                results: list[Any] = score_batch(self.model, [(r.prompt, r.completion) for r in requests],
                                                 pad_id=self.pad_id, ranks=any(r.ranks for r in requests))
        except Exception as exc:  # noqa: BLE001 - every waiter hears about it; the engine keeps serving
            results = [exc] * len(requests)
        _answer(requests, results)


def _score_chunks(requests: list[_Score], max_rows: int) -> list[list[_Score]]:
    """Requests grouped for forward passes: similar lengths together (little padding), at most
    ``max_rows`` rows and ``SCORE_TOKENS`` padded tokens a pass (one longer request goes alone)."""
    chunks: list[list[_Score]] = []
    for request in sorted(requests, key=lambda r: len(r.prompt) + len(r.completion)):
        width = len(request.prompt) + len(request.completion)  # the longest so far: sorted ascending
        if chunks and len(chunks[-1]) < max_rows and (len(chunks[-1]) + 1) * width <= SCORE_TOKENS:
            chunks[-1].append(request)
        else:
            chunks.append([request])
    return chunks


@torch.no_grad()
def score_batch(model: Any, rows: Sequence[tuple[Sequence[int], Sequence[int]]], *, pad_id: int,
                ranks: bool = False) -> list[tuple[list[float], list[int]]]:
    """Per ``(prompt, completion)`` row (both non-empty): the temperature-1 log-prob of each
    completion token given everything before it, and with ``ranks`` its rank (``[]`` otherwise).
    One forward pass; the output head runs only past the shortest prompt, in chunks of positions
    (:func:`~rlvr.backends.model.io.selected_logprobs`: the trainer's definition), ranks from the same
    hidden states."""
    device = next(model.parameters()).device
    full = [list(p) + list(c) for p, c in rows]
    width = max(map(len, full))
    ids = torch.tensor([f + [pad_id] * (width - len(f)) for f in full], device=device)
    mask = torch.tensor([[1] * len(f) + [0] * (width - len(f)) for f in full], device=device)
    skip = min(len(p) for p, _ in rows) - 1  # targets before every row's first completion token
    model.eval()  # as sample_batch: the trainer sets train mode itself at each step
    inputs, at_rows, at_cols = scored_positions(ids, mask, skip)
    features = position_features(model, inputs, at_rows, at_cols, "none")
    targets = ids[at_rows, at_cols + 1]
    shape = (ids.shape[0], width - 1 - skip)
    logp = spread(features.logprobs(targets, 1.0), at_rows, at_cols - skip, shape)
    rank = spread(features.ranks(targets), at_rows, at_cols - skip, shape) if ranks else None
    out = []
    for row, (p, c) in enumerate(rows):
        at = slice(len(p) - 1 - skip, len(p) - 1 - skip + len(c))
        out.append((logp[row, at].tolist(), rank[row, at].tolist() if rank is not None else []))
    return out


def _answer(requests: Sequence[_Request | _Score], results: Sequence[Any]) -> None:
    for request, result in zip(requests, results, strict=True):
        try:
            request.loop.call_soon_threadsafe(resolve, request.future, result)
        except RuntimeError:  # the caller's loop closed meanwhile: nobody waits for this answer
            pass

