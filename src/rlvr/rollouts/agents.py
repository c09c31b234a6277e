"""Agent rollouts: an unmodified agent program plays each episode against the recording proxy.

``[task] agent = "package.module:run"`` (or ``"path/agent.py:run"``) names a function
``run(base_url, row)``, plain or ``async``, that runs any agent program with ``base_url`` as its
OpenAI-compatible endpoint (``OpenAI(base_url=base_url)``, the Agents SDK, a CLI given the URL).
``row`` is a plain dict: ``id``, ``prompt`` (the text of the row's last user message), ``messages``
(the row's prompt messages), ``answer``, ``info`` and ``sample`` (which of the row's ``group_k``
samples this is). Every model call the agent makes through ``base_url`` is sampled from the run's
policy under the run's sampling settings (its temperature and token budget in training, greedy on
held-out rows, whatever the agent asks), recorded, and stitched into training segments by turn
matching (:mod:`rlvr.rollouts.turns`). The episode is one sample of the row: its segments share
its reward and advantage, and staleness is judged by its oldest call.

What ``run`` returns decides the conversation the environment's ``reward_fn(messages, answer)``
scores:

- a string: the agent's final answer, scored as ``[*row messages, {"role": "assistant", "content": it}]``;
- a list of messages: that conversation, as it is;
- ``None``: the conversation of the agent's last model call followed by the reply it got;
- a dict with any of ``messages`` / ``answer`` (as above), ``reward`` (a number the environment
  already computed, e.g. a hub environment's own score: used instead of ``reward_fn``) and
  ``metrics`` (numbers recorded beside the reward).

An episode in which the agent made no model call has nothing to train on: it raises, and the run's
``on_sample_error`` decides (stop, or drop the sample). A plain ``run`` runs in a thread of its own
(it may block on its HTTP calls for as long as it likes); one that outlives the episode (a timeout)
finds its session closed: every later call is refused, never recorded into another episode.

``max_episodes`` (``task.agent_concurrency``) bounds the episodes running at once, for agents that
start programs (a sandbox, a hub's harness) a machine can run only so many of: the others wait their
turn, and that wait is not counted against ``rollout_timeout_s``. An episode the loop gives up on
frees its slot at once.

Standard library only.
"""

from __future__ import annotations

import asyncio
import collections
import inspect
import math
import threading
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager, nullcontext
from typing import Any, Protocol

from rlvr.errors import AgentError
from rlvr.protocols import RolloutFn, RolloutSetup
from rlvr.rollouts.clock import Clocked, RolloutClock, current_clock
from rlvr.rollouts.turns import Call, Segment, Turn
from rlvr.types import Message, Rollout, RolloutRequest, SamplingParams


class Episode(Protocol):
    calls: list[Call]
    turns: list[Turn]
    segments: list[Segment]


class AgentGateway(Protocol):
    """Where agents reach the model: the recording proxy (:class:`rlvr.backends.proxy.app.AgentProxy`)."""

    def open(self, generator: Any, params: SamplingParams | None, *, seed: int | None = None,
             meta: Mapping[str, Any] | None = None) -> tuple[str, str]: ...

    def close(self, session: str) -> Episode: ...


def row_of(request: RolloutRequest) -> dict[str, Any]:
    """What ``run(base_url, row)`` receives (see the module docstring)."""
    messages = request.messages
    users = [m for m in messages if m.get("role") == "user"]
    prompt = users[-1].get("content") if users else (messages[-1].get("content") if messages else "")
    return {"id": request.id, "prompt": prompt if isinstance(prompt, str) else "", "messages": list(messages),
            "answer": request.answer, "info": request.info, "sample": request.index}


class EpisodeSlots:
    """At most ``size`` episodes at once; the others wait in turn, on whatever event loop or thread
    they run. Thread-safe."""

    def __init__(self, size: int):
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise ValueError(f"episode slots: size must be an integer >= 1, got {size!r}")
        self.size = size
        self.busy = 0
        self._lock = threading.Lock()
        self._waiters: collections.deque[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = \
            collections.deque()

    @asynccontextmanager
    async def turn(self, clock: RolloutClock | None = None) -> AsyncIterator[None]:
        """Hold a slot for the block; ``clock`` (the episode's) stands still while it waits for one."""
        with clock.waiting() if clock is not None else nullcontext():
            await self._acquire()
        try:
            yield
        finally:
            self._release()

    async def _acquire(self) -> None:
        loop = asyncio.get_running_loop()
        with self._lock:
            if self.busy < self.size and not self._waiters:
                self.busy += 1
                return
            waiter = (loop, loop.create_future())
            self._waiters.append(waiter)
        try:
            await waiter[1]
        except asyncio.CancelledError:
            with self._lock:
                queued = waiter in self._waiters
                if queued:
                    self._waiters.remove(waiter)
            if not queued and waiter[1].done() and not waiter[1].cancelled():
                self._release()  # granted as it was cancelled: hand the slot on
            raise  # (granted but not yet delivered: _grant finds it cancelled and hands it on)

    def _release(self) -> None:
        """Hand the slot to the first waiter whose loop still runs, else free it."""
        with self._lock:
            while self._waiters:
                loop, future = self._waiters.popleft()
                try:
                    loop.call_soon_threadsafe(self._grant, future)
                    return
                except RuntimeError:  # its loop is closed: nobody waits there any more
                    continue
            self.busy -= 1

    def _grant(self, future: asyncio.Future[None]) -> None:
        if future.done():  # cancelled meanwhile
            self._release()
        else:
            future.set_result(None)


def agent_rollout(setup: RolloutSetup, run: Callable[..., Any], gateway: AgentGateway, *,
                  phase: str = "train", max_episodes: int | None = None) -> RolloutFn:
    """Episodes of ``run`` through ``gateway``, sampled from ``setup.generator`` under ``setup.params``;
    at most ``max_episodes`` at once (``None``: as many as are asked for)."""
    if not callable(run):
        raise AgentError(f"the agent {run!r} is not a function run(base_url, row)")
    is_async = inspect.iscoroutinefunction(run)
    slots = EpisodeSlots(max_episodes) if max_episodes is not None else None

    async def rollout(request: RolloutRequest) -> Rollout | list[Rollout]:
        clock = current_clock()
        async with slots.turn(clock) if slots is not None else nullcontext():  # a turn's wait is the machine's
            return await episode(request, clock)

    async def episode(request: RolloutRequest, clock: RolloutClock | None) -> Rollout | list[Rollout]:
        meta = {"row": request.id, "sample": request.index, "version": request.version, "phase": phase}
        # The proxy calls the generator on its own thread: the clock goes with it, so the agent's waits for
        # its model calls are not counted against rollout_timeout_s (rlvr.rollouts.clock), its own work is.
        generator = Clocked(setup.generator, clock)
        session, url = gateway.open(generator, setup.params, seed=request.seed, meta=meta)
        try:
            row = row_of(request)
            result = await run(url, row) if is_async else await _in_thread(run, url, row)
        finally:
            closed = gateway.close(session)
        return to_rollouts(request, closed, result, setup.tokenizer.decode, session)

    rollout.__qualname__ = f"agent_rollout({getattr(run, '__qualname__', run)!s})"
    return rollout


async def _in_thread(fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)`` in a daemon thread of its own: an agent may block for long, and one abandoned at
    a timeout must not hold the interpreter's exit (as a pool thread would)."""
    loop = asyncio.get_running_loop()
    future = loop.create_future()

    def settle(outcome: Any, failed: bool) -> None:
        if not future.done():
            future.set_exception(outcome) if failed else future.set_result(outcome)

    def work() -> None:
        try:
            result, failed = fn(*args), False
        except BaseException as exc:  # noqa: BLE001 - handed to the awaiting episode, whatever it is
            result, failed = exc, True
        try:
            loop.call_soon_threadsafe(settle, result, failed)
        except RuntimeError:
            pass  # the loop closed meanwhile: nobody waits for this episode

    threading.Thread(target=work, name="rlvr-agent", daemon=True).start()
    return await future


def to_rollouts(request: RolloutRequest, episode: Episode, result: Any, decode: Callable[[Sequence[int]], str],
                session: str = "") -> Rollout | list[Rollout]:
    """The episode's segments as rollouts, the last one carrying the conversation (and, if the agent
    gave them, the reward and metrics) the episode is scored by."""
    if not episode.segments:
        raise AgentError(f"row {request.id!r} sample {request.index}: the agent made no model call through its "
                         f"base URL (session {session!r}), so there is nothing to train on; does it use the "
                         "base_url it is given?")
    messages, reward, metrics = _result(request, episode, result)
    calls = {c.index: c for c in episode.calls}
    out = []
    for k, s in enumerate(episode.segments):
        last = k == len(episode.segments) - 1
        reply = calls[s.calls[-1]]
        out.append(Rollout(task_id=request.id, prompt_ids=s.prompt_ids, completion_ids=s.completion_ids,
                           logprobs=s.logprobs, text=decode(reply.completion_ids),
                           messages=tuple(messages) if last else s.messages, version=s.version,
                           stop_reason=s.stop_reason, loss_mask=s.loss_mask, reward=reward if last else None,
                           metrics=dict(metrics) if last else {}))
    return out if len(out) > 1 else out[0]


def _result(request: RolloutRequest, episode: Episode, result: Any) -> tuple[list[Message], float | None,
                                                                             dict[str, float]]:
    """The conversation to score, the agent's own reward (if any) and its metrics."""
    where = f"row {request.id!r} sample {request.index}: the agent returned"
    reward, metrics = None, {}
    if isinstance(result, Mapping):
        unknown = sorted(set(result) - {"messages", "answer", "reward", "metrics"})
        if unknown:
            raise AgentError(f"{where} a dict with keys {unknown}; it may have messages, answer, reward, metrics")
        reward = result.get("reward")
        if reward is not None and (not isinstance(reward, int | float) or isinstance(reward, bool)
                                   or not math.isfinite(reward)):
            raise AgentError(f"{where} reward={reward!r}; a reward is a finite number")
        metrics = {str(k): float(v) for k, v in (result.get("metrics") or {}).items()}
        result = result.get("messages", result.get("answer"))
    if isinstance(result, str):
        return [*request.messages, {"role": "assistant", "content": result}], reward, metrics
    if isinstance(result, list) and all(isinstance(m, Mapping) and "role" in m for m in result):
        return [dict(m) for m in result], reward, metrics
    if result is None:
        last = max(episode.calls, key=lambda c: c.index)
        reply = [last.reply] if last.reply is not None else []
        history = list(last.messages) if last.messages is not None else list(request.messages)
        return [*history, *reply], reward, metrics
    raise AgentError(f"{where} {type(result).__name__}; return the final answer (str), the conversation (a list "
                     "of messages), None (the last model call's conversation) or a dict (see rlvr.rollouts.agents)")
