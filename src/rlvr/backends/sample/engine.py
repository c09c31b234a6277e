"""The in-process generation engine: a :class:`~rlvr.rollouts.episodes.Generator` over a transformers model.

Generation runs in the engine's own worker thread, so sampling overlaps a train step on the
caller's thread (torch releases the GIL inside its kernels). Concurrent ``generate`` calls are
batched: every request made during one turn of the caller's event loop goes to the worker as one
batch, so the default rollout function (one request per sample, all submitted together) costs one
``model.generate`` per step, as a batch sampler would. Each request's draw comes from its own seed
(:class:`~rlvr.backends.sample.batched.SeededSampling`), so a completion depends on its prompt and
seed only, never on which other requests shared its batch.

Weights: the engine samples either from the live model (``version`` a callable reading the live
policy's version; safe when nothing trains while it samples, i.e. ``max_head_offpolicy_versions =
0``) or from its own replica, updated by :meth:`publish` at version boundaries: the copy is taken
on the caller's thread (after the train step, before sampling may use the new version) and loaded
by the worker between two batches, so no batch mixes weights and every completion carries the
version that produced it.

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

from rlvr.backends.sample.batched import sample_batch
from rlvr.errors import BackendError
from rlvr.types import Completion, SamplingParams


@dataclass(slots=True)
class _Request:
    prompt: tuple[int, ...]
    params: SamplingParams
    seed: int
    future: asyncio.Future
    loop: asyncio.AbstractEventLoop


class InProcessEngine:
    """``await engine.generate(prompt_ids, params, seed=...)`` from any asyncio loop."""

    def __init__(self, model: torch.nn.Module, *, eos_ids: set[int], pad_id: int,
                 version: int | Callable[[], int] = 0, max_batch: int = 512, name: str = "rlvr-engine"):
        self.model, self.eos_ids, self.pad_id, self.max_batch = model, set(eos_ids), pad_id, max_batch
        self._version = version
        self._pending: list[_Request] = []
        self._lock = threading.Lock()
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self.batches = 0  # generate calls made, for tests and benchmarks
        self._broken: Exception | None = None
        self._thread = threading.Thread(target=self._work, name=name, daemon=True)
        self._thread.start()

    @classmethod
    def replica_of(cls, policy: Any, **kwargs: Any) -> InProcessEngine:
        """An engine over a private copy of ``policy.model`` at ``policy.version``."""
        model = copy.deepcopy(policy.model).eval()
        model.requires_grad_(False)
        return cls(model, eos_ids=policy.eos_ids, pad_id=policy.tokenizer.pad_token_id,
                   version=policy.version, **kwargs)

    @property
    def version(self) -> int:
        return self._version() if callable(self._version) else self._version

    async def generate(self, prompt_ids: Sequence[int], params: SamplingParams, *, seed: int) -> Completion:
        if not prompt_ids:
            raise BackendError("generate: empty prompt")
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        with self._lock:
            first = not self._pending
            self._pending.append(_Request(tuple(prompt_ids), params, seed, future, loop))
        if first:
            loop.call_soon(self._flush)  # after every request of this loop turn has been made
        return await future

    def _flush(self) -> None:
        with self._lock:
            batch, self._pending = self._pending, []
        if batch:
            self._jobs.put(("generate", batch))

    def publish(self, weights: dict[str, torch.Tensor], version: int) -> int:
        """Serve ``weights`` (name → tensor, e.g. the trainable ones) from the next batch on.
        Requests made after this call are answered by ``version`` or later."""
        if callable(self._version):
            raise BackendError("this engine samples the live model; it has no replica to publish to")
        copies = {name: w.detach().clone() for name, w in weights.items()}
        self._jobs.put(("load", copies, version))
        return version

    def close(self) -> None:
        self._jobs.put(("stop",))
        self._thread.join(timeout=30)

    # ---- worker thread --------------------------------------------------------------------
    def _work(self) -> None:
        while True:
            job = self._jobs.get()
            if job[0] == "stop":
                return
            if job[0] == "load":
                try:
                    self._load(job[1], job[2])
                except Exception as exc:  # noqa: BLE001 - answered to every later request, never lost in this thread
                    self._broken = exc
                continue
            self._run(job[1])

    def _load(self, weights: dict[str, torch.Tensor], version: int) -> None:
        params = dict(self.model.named_parameters())
        missing = sorted(set(weights) - set(params))
        if missing:
            raise BackendError(f"engine replica has no parameter(s) {missing[:3]}")
        with torch.no_grad():
            for name, w in weights.items():
                params[name].copy_(w)
        self._version = version

    def _run(self, batch: list[_Request]) -> None:
        by_params: dict[SamplingParams, list[_Request]] = {}
        for request in batch:
            by_params.setdefault(request.params, []).append(request)
        for params, requests in by_params.items():
            for start in range(0, len(requests), self.max_batch):
                self._generate(params, requests[start:start + self.max_batch])

    def _generate(self, params: SamplingParams, requests: list[_Request]) -> None:
        live = [r for r in requests if not r.future.cancelled()]
        if not live:
            return
        try:
            if self._broken is not None:
                raise BackendError(f"engine weights could not be loaded: {self._broken}") from self._broken
            version = self.version
            outs = sample_batch(self.model, [r.prompt for r in live], params, seed=[r.seed for r in live],
                                eos_ids=self.eos_ids, pad_id=self.pad_id)
            self.batches += 1
            results: list[Any] = [Completion(o.ids, o.logprobs, o.stop_reason, version) for o in outs]
        except Exception as exc:  # noqa: BLE001 - every waiter hears about it; the engine keeps serving
            results = [exc] * len(live)
        for request, result in zip(live, results, strict=True):
            try:
                request.loop.call_soon_threadsafe(_resolve, request.future, result)
            except RuntimeError:  # the caller's loop closed meanwhile: nobody waits for this answer
                pass


def _resolve(future: asyncio.Future, result: Any) -> None:
    if future.done():
        return
    if isinstance(result, BaseException):
        future.set_exception(result)
    else:
        future.set_result(result)
