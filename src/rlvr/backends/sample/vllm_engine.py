"""vLLM's engine inside the training process: :class:`ColocatedVLLM`, a :class:`~rlvr.protocols.Generator`
(and :class:`~rlvr.protocols.Scorer`) on the trainer's device.

Every engine call runs on the engine's own worker thread, one at a time, so generation never runs
twice at once on the device and weight loads fall between two calls:

- **generation**: the requests made during one turn of a caller's event loop go to the worker
  together; the worker also takes every request already waiting for it (the held-out evaluator's,
  the rollout stream's), and hands them all to one ``LLM.generate`` call. Each request has its own
  ``SamplingParams`` and seed (:func:`~rlvr.backends.sample.vllm_setup.request_kwargs`), so a
  completion depends on its prompt and seed, not on what shared its call. A completion carries the
  sampled ids (eos or stop token included), their processed log-probs, the stop reason and the policy
  version the engine held for the whole call;
- **weights** (:meth:`publish`): the caller's ``weights()`` iterator of ``(name, tensor)`` in the
  checkpoint's names is read by vLLM's in-place reload (``reload_weights(weights_iterator=...)`` on
  the in-process worker: each layer's weights loaded, then re-processed as at start, which on the
  CPU re-packs the linear layers), the prefix cache reset (no KV of the old weights is reused), and
  the version set, all before the next call. Nothing touches the disk;
- **sleep** (:meth:`sleep`, CUDA and ``sleep=True`` only): ``LLM.sleep(level=1)`` offloads the
  weights to host memory and drops the KV cache while the trainer trains; the next call or load
  wakes the engine first (a request that arrives while it sleeps wakes it too, counted in
  :attr:`woken_to_sample`). The device memory in use is read just before and after each sleep.

Failures reach the callers that waited: an error in ``LLM.generate`` fails every request of that
call; a failed load fails the publish and every later call (the engine's weights are then unknown).

A backend module: imports torch; vLLM is built by the caller (:func:`~rlvr.backends.sample.vllm_setup.start_llm`).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import math
import queue
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from rlvr.backends.exit_wait import hold_exit
from rlvr.backends.sample.futures import resolve
from rlvr.backends.sample.vllm_setup import device_used_gb, request_kwargs, score_kwargs
from rlvr.errors import BackendError
from rlvr.types import Completion, SamplingParams, StopReason

LOGPROB_FLOOR = -9999.0  # a non-finite sampled-token log-prob is recorded as this (as the HTTP sampler does)
_STOP = {"stop": StopReason.STOP, "length": StopReason.LENGTH, "abort": StopReason.ABORT}
Weights = Callable[[], Iterable[tuple[str, torch.Tensor]]]


@dataclass(slots=True)
class _Call:
    """One request: ``kwargs`` for ``vllm.SamplingParams``; ``score`` > 0 reads back the log-probs of
    the prompt's last ``score`` tokens instead of a completion. ``loop`` is None for a caller that
    waits on a thread (``future`` is then a concurrent one)."""

    prompt: tuple[int, ...]
    kwargs: dict[str, Any]
    future: Any
    loop: asyncio.AbstractEventLoop | None
    score: int = 0


class ColocatedVLLM:
    """``await engine.generate(prompt_ids, params, seed=...)`` from any asyncio loop; ``llm`` is a
    ``vllm.LLM`` built in this process (or anything with its ``generate``, ``collective_rpc``,
    ``reset_prefix_cache``, ``sleep`` and ``wake_up``)."""

    def __init__(self, llm: Any, *, eos_ids: Iterable[int], version: int = 0, sleep: bool = False,
                 max_model_len: int | None = None, describe: dict[str, Any] | None = None,
                 name: str = "rlvr-vllm"):
        self.llm, self.eos_ids, self._version = llm, sorted(set(eos_ids)), version
        self.can_sleep, self.asleep = sleep, False
        self.max_model_len, self.info = max_model_len, dict(describe or {})
        self.calls = 0  # LLM.generate calls made, for tests and the record
        self.woken_to_sample = 0  # requests that found the engine asleep and had to wake it
        self.last_sleep: dict[str, float] = {}
        self._pending: list[_Call] = []
        self._lock = threading.Lock()
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._held: tuple | None = None  # a job taken while gathering requests, run next
        self._broken: BaseException | None = None
        self.build_request: Callable[[tuple[int, ...], dict[str, Any]], tuple[Any, Any]] = vllm_request
        self._thread = threading.Thread(target=self._work, name=name, daemon=True)
        self._thread.start()
        hold_exit(self, self._thread, lambda engine: engine._jobs.put(("stop",)))  # never left mid-step at exit

    @property
    def version(self) -> int:
        return self._version

    # ---- the Generator and Scorer protocols ---------------------------------------------------
    async def generate(self, prompt_ids: Sequence[int], params: SamplingParams, *, seed: int) -> Completion:
        if not prompt_ids:
            raise BackendError("colocated vLLM: generate needs a non-empty prompt")
        self._fits(len(prompt_ids), params.max_tokens)
        return await self._ask(_Call(tuple(int(t) for t in prompt_ids), request_kwargs(params, seed, self.eos_ids),
                                     None, None))

    async def score(self, prompt_ids: Sequence[int], completion_ids: Sequence[int]) -> list[float]:
        """``log p(completion_ids[t] | prompt_ids + completion_ids[:t])`` for every t, at temperature 1,
        under the weights the engine holds now."""
        if not prompt_ids:
            raise BackendError("colocated vLLM: score needs a non-empty prompt")
        if not completion_ids:
            return []
        ids = tuple(int(t) for t in prompt_ids) + tuple(int(t) for t in completion_ids)
        self._fits(len(ids), 1)
        return await self._ask(_Call(ids, score_kwargs(), None, None, score=len(completion_ids)))

    def generate_now(self, prompt_ids: Sequence[int], params: SamplingParams, *, seed: int) -> Completion:
        """:meth:`generate` for a caller on a plain thread (the weight-sync lane's probe)."""
        self._fits(len(prompt_ids), params.max_tokens)
        call = _Call(tuple(int(t) for t in prompt_ids), request_kwargs(params, seed, self.eos_ids),
                     concurrent.futures.Future(), None)
        self._put(("calls", [call]))
        return call.future.result()

    def _put(self, job: tuple) -> None:
        if not self._thread.is_alive():
            raise BackendError("colocated vLLM: the engine was closed (the run is ending); nothing more is served")
        self._jobs.put(job)

    def _fits(self, prompt_len: int, max_tokens: int) -> None:
        if self.max_model_len and prompt_len + max_tokens > self.max_model_len:
            raise BackendError(f"colocated vLLM: a prompt of {prompt_len} tokens plus max_tokens={max_tokens} exceeds "
                               f"the engine's max_model_len of {self.max_model_len}; shorten the conversation or "
                               "lower sampler.max_new_tokens")

    async def _ask(self, call: _Call) -> Any:
        if not self._thread.is_alive():
            raise BackendError("colocated vLLM: the engine was closed (the run is ending); nothing more is served")
        loop = asyncio.get_running_loop()
        call.future, call.loop = loop.create_future(), loop
        with self._lock:
            first = not self._pending
            self._pending.append(call)
        if first:
            loop.call_soon(self._flush)  # after every request of this loop turn has been made
        return await call.future

    def _flush(self) -> None:
        with self._lock:
            calls, self._pending = self._pending, []
        if calls:
            self._jobs.put(("calls", calls))

    # ---- weights and memory, from the trainer's thread -------------------------------------------
    def publish(self, weights: Weights, version: int) -> int:
        """Load ``weights()`` (read on the worker, between two calls) and serve them as ``version``;
        returns once loaded. Requests made after this call are answered by ``version`` or later."""
        return self._run_job("load", weights, version)

    def sleep(self) -> dict[str, float]:
        """Release the engine's device memory until its next call or load (a no-op without sleep
        mode); returns the figures of this sleep (:attr:`last_sleep`)."""
        if not self.can_sleep:
            return {}
        return self._run_job("sleep")

    def _run_job(self, kind: str, *args: Any) -> Any:
        done: concurrent.futures.Future = concurrent.futures.Future()
        self._put((kind, done, *args))
        return done.result()

    def close(self) -> None:
        if self._thread.is_alive():
            self._jobs.put(("stop",))
            self._thread.join(timeout=60)
        self.llm = None  # the engine's memory goes with the last reference

    def describe(self) -> dict[str, Any]:
        return {"type": f"{__name__}.{type(self).__name__}", **self.info}

    # ---- worker thread ----------------------------------------------------------------------
    def _work(self) -> None:
        while True:
            job, self._held = self._held or self._jobs.get(), None
            kind = job[0]
            if kind == "stop":
                return
            if kind == "calls":
                self._generate(job[1] + self._more_calls())
                continue
            done = job[1]
            try:
                result = self._load(*job[2:]) if kind == "load" else self._sleep()
            except BaseException as exc:  # noqa: BLE001 - the waiting thread re-raises it
                if kind == "load":
                    self._broken = exc
                done.set_exception(exc)
            else:
                done.set_result(result)

    def _more_calls(self) -> list[_Call]:
        """Every request already waiting, up to the first job of another kind (kept for next)."""
        calls: list[_Call] = []
        while True:
            try:
                job = self._jobs.get_nowait()
            except queue.Empty:
                return calls
            if job[0] != "calls":
                self._held = job
                return calls
            calls += job[1]

    def _generate(self, calls: list[_Call]) -> None:
        live = [c for c in calls if not c.future.cancelled()]
        if not live:
            return
        try:
            if self._broken is not None:
                raise BackendError(f"colocated vLLM: the engine's weights could not be loaded ({self._broken}); "
                                   "its weights are unknown, so it serves nothing") from self._broken
            if self.asleep:
                self.woken_to_sample += 1
            self._wake()
            version = self._version
            prompts, params = zip(*(self.build_request(c.prompt, c.kwargs) for c in live), strict=True)
            outs = self.llm.generate(list(prompts), list(params), use_tqdm=False)
            self.calls += 1
            results: list[Any] = [_read(c, out, version) for c, out in zip(live, outs, strict=True)]
        except Exception as exc:  # noqa: BLE001 - every waiter hears about it; the engine keeps serving
            results = [exc] * len(live)
        for call, result in zip(live, results, strict=True):
            _answer(call, result)

    def _load(self, weights: Weights, version: int) -> int:
        self._wake()
        self.llm.collective_rpc(_reload, args=(weights,))
        self.llm.reset_prefix_cache()
        self._version = version
        self._broken = None
        return version

    def _sleep(self) -> dict[str, float]:
        if self.asleep:
            return self.last_sleep
        before, start = device_used_gb(), time.perf_counter()
        self.llm.sleep(level=1)
        self.asleep = True
        figures = {"vllm/sleep_s": time.perf_counter() - start}
        after = device_used_gb()
        if before is not None and after is not None:
            figures |= {"vllm/awake_device_gb": before, "vllm/asleep_device_gb": after}
        self.last_sleep = figures
        return figures

    def _wake(self) -> None:
        if not self.asleep:
            return
        start = time.perf_counter()
        self.llm.wake_up()
        self.asleep = False
        self.last_sleep["vllm/wake_s"] = time.perf_counter() - start


def _reload(worker: Any, weights: Weights) -> None:
    """Run on vLLM's in-process worker: reload every layer from ``weights()`` (checkpoint names)."""
    with torch.no_grad():  # the weights may be computed here (merged LoRA): no graph for them
        worker.model_runner.reload_weights(weights_iterator=iter(weights()), is_checkpoint_format=True)


def vllm_request(prompt: tuple[int, ...], kwargs: dict[str, Any]) -> tuple[Any, Any]:
    """vLLM's prompt and ``SamplingParams`` for one request (token-id bad words set after
    construction: the field vLLM fills from text bad words, which its sampler applies)."""
    from vllm import SamplingParams as VLLMParams
    from vllm.inputs import TokensPrompt

    kwargs = dict(kwargs)
    bad = kwargs.pop("_bad_words_token_ids", None)
    params = VLLMParams(**kwargs)
    if bad is not None:
        params._bad_words_token_ids = bad
    return TokensPrompt(prompt_token_ids=list(prompt)), params


def _read(call: _Call, out: Any, version: int) -> Completion | list[float] | BaseException:
    """A vLLM ``RequestOutput`` as the caller's answer: a Completion, or the scored log-probs."""
    if call.score:
        return _scores(call.prompt, out.prompt_logprobs, call.score)
    choice = out.outputs[0]
    ids = tuple(int(t) for t in choice.token_ids)
    values = _sampled_logprobs(choice.logprobs, ids)
    if values is None:
        return BackendError(f"colocated vLLM: the completion of a prompt of {len(call.prompt)} tokens came back "
                            f"without a log-prob per token ({len(ids)} tokens)")
    return Completion(ids, values, _STOP.get(str(choice.finish_reason), StopReason.ABORT), version)


def _sampled_logprobs(flat: Any, ids: Sequence[int], first: int = 0) -> tuple[float, ...] | None:
    """The log-prob of ``ids[i]`` at position ``first + i`` of vLLM's flat log-probs (``logprobs=0``:
    the sampled token is each position's only entry; prompt log-probs: the prompt token's)."""
    if flat is None or len(flat) != first + len(ids):
        return None
    out = []
    for position, token in enumerate(ids, start=first):
        found = [flat.logprobs[j] for j in range(flat.start_indices[position], flat.end_indices[position])
                 if flat.token_ids[j] == token]
        if not found:
            return None
        out.append(found[0] if math.isfinite(found[0]) else LOGPROB_FLOOR)
    return tuple(out)


def _scores(ids: Sequence[int], flat: Any, n: int) -> list[float] | BaseException:
    """The log-probs of the last ``n`` of ``ids`` from vLLM's prompt log-probs (one position per
    prompt token, the first one empty)."""
    values = _sampled_logprobs(flat, ids[len(ids) - n:], first=len(ids) - n)
    if values is None or not all(v > LOGPROB_FLOOR for v in values):
        return BackendError(f"colocated vLLM: scoring {n} tokens after a prompt of {len(ids) - n} returned no finite "
                            "log-prob for some position")
    return list(values)


def _answer(call: _Call, result: Any) -> None:
    if call.loop is None:
        if not call.future.done():
            (call.future.set_exception if isinstance(result, BaseException) else call.future.set_result)(result)
        return
    try:
        call.loop.call_soon_threadsafe(resolve, call.future, result)
    except RuntimeError:  # the caller's loop closed meanwhile: nobody waits for this answer
        pass
