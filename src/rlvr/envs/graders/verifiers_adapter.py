"""Environments of the ``verifiers`` package, seen through rlvr's contract (the ``verifiers`` extra).

``from_verifiers(env)`` wraps a *classic* verifiers environment (``vf.Environment`` /
``vf.SingleTurnEnv`` with a ``rubric``: verifiers 0.1.x, and ``verifiers.legacy`` in 0.2-0.3)
or loads one by id (``from_verifiers("gsm8k", **env_args)`` calls ``vf.load_environment``).
The result has:

- ``reward_fn(messages, answer) -> Score``: the rubric's ``score_rollout`` on the conversation;
  the value is the rubric's weighted reward, its per-function scores are the metrics.
- ``rows(split="train" | "eval", n=None)`` and ``make_rows(n, *, seed=0)``: rlvr rows from the
  environment's ``dataset`` / ``eval_dataset`` (dataset order; ``seed`` is accepted for the
  procedural-task signature and ignored: the loop's split and cursor are seeded already).

Rows carry ``answer`` packed as ``{"answer": ..., "info": ..., "task": ...}`` because verifiers
reward functions may read ``info`` and ``task`` and rlvr passes reward functions only
``(messages, answer)``; ``reward_fn`` unpacks it (a plain answer works too, with empty info).
``messages`` are split into verifiers' ``prompt`` (before the first assistant message) and
``completion`` (from it on). For ``message_type == "completion"`` environments both are text.

Rubrics with group-level reward functions (``states``/``completions`` parameters) cannot score
one rollout alone and are refused. ``verifiers.v1`` environments (``vf.Env`` with tasksets and
harnesses, verifiers >= 0.2) have a different, agent-oriented contract and are not supported.

Rubrics are async; ``reward_fn`` runs them on a private event loop in a daemon thread, so it
works from plain threads and from inside another running event loop alike (async callers can
``await adapter.ascore(messages, answer)`` instead). Only the standard library is imported
here; ``verifiers`` itself is imported only when an environment is loaded by id.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import threading
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from rlvr.errors import ConfigError, require_extra
from rlvr.reward import Score

EXTRA = "verifiers"
_PACKED = frozenset({"answer", "info", "task"})


def from_verifiers(env: Any, *, timeout: float | None = None, **env_args: Any) -> VerifiersEnv:
    """Wrap a classic verifiers environment, or load one by id with ``env_args`` and wrap it.

    ``timeout``: seconds one ``reward_fn`` call may wait for the rubric (``None``: no bound);
    past it ``reward_fn`` raises ``TimeoutError``.
    """
    if isinstance(env, str):
        require_extra(EXTRA, "verifiers")
        import verifiers

        loader = getattr(verifiers, "load_environment", None)
        if not callable(loader):
            version = getattr(verifiers, "__version__", "?")
            raise ConfigError(f"verifiers {version} has no load_environment for classic environments "
                              "(only verifiers.v1, which rlvr does not support); install verifiers<0.4")
        env = loader(env, **env_args)
    elif env_args:
        raise ConfigError(f"from_verifiers: keyword arguments {sorted(env_args)} are only used when loading an "
                          "environment by id")
    return VerifiersEnv(env, timeout=timeout)


def load_environment(env_id: str, **kwargs: Any) -> VerifiersEnv:
    """The factory :func:`rlvr.envs.loading.load_environment` calls: ``env_id`` plus its arguments."""
    return from_verifiers(env_id, **kwargs)


class VerifiersEnv:
    """A classic verifiers environment behind ``reward_fn(messages, answer)``; see the module docs."""

    def __init__(self, env: Any, *, timeout: float | None = None) -> None:
        rubric = getattr(env, "rubric", None)
        score_rollout = getattr(rubric, "score_rollout", None)
        if not callable(score_rollout):
            raise ConfigError(
                f"{type(env).__name__} is not a classic verifiers environment: it has no rubric with "
                "score_rollout (verifiers.v1 Env/Taskset environments are not supported)"
            )
        group_funcs = getattr(rubric, "_get_group_reward_funcs", None)
        if callable(group_funcs) and group_funcs():
            names = [getattr(f, "__name__", repr(f)) for f in group_funcs()]
            raise ConfigError(f"the rubric of {type(env).__name__} has group-level reward functions {names}; "
                              "rlvr scores one rollout at a time, so they cannot run here")
        if timeout is not None and not timeout > 0:
            raise ConfigError(f"from_verifiers: timeout must be positive seconds or None, got {timeout!r}")
        self.env, self.rubric, self.timeout = env, rubric, timeout
        self.name = str(getattr(env, "env_id", None) or type(env).__name__)
        self.message_type = getattr(env, "message_type", "chat")
        self._call_style = _call_style(score_rollout)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_lock = threading.Lock()

    # ------------------------------------------------------------------------------------ reward

    def reward_fn(self, messages: Sequence[Mapping[str, Any]], answer: Any) -> Score:
        future = asyncio.run_coroutine_threadsafe(self.ascore(messages, answer), self._event_loop())
        try:
            return future.result(self.timeout)
        except TimeoutError:
            future.cancel()
            raise TimeoutError(f"verifiers rubric of {self.name} did not score within {self.timeout}s") from None

    async def ascore(self, messages: Sequence[Mapping[str, Any]], answer: Any) -> Score:
        """The rubric's score for one conversation, for callers already in an event loop."""
        gold, info, task = unpack_answer(answer)
        prompt, completion = split_messages(messages, self.message_type)
        state: dict[str, Any] = {
            "prompt": prompt, "completion": completion, "answer": gold, "info": info, "task": task,
            "example_id": 0, "responses": [], "trajectory": [], "turn": 0, "is_completed": True,
            "is_truncated": False, "reward": None, "metrics": None,
            "timing": {"generation_ms": 0.0, "scoring_ms": 0.0, "total_ms": 0.0},
        }
        score_rollout = self.rubric.score_rollout
        if self._call_style == "kwargs":  # verifiers <= 0.1.4: returns a RolloutScore
            result = await _maybe_await(score_rollout(prompt=prompt, completion=completion, answer=gold,
                                                      state=state, task=task, info=info))
            reward, metrics = _get(result, "reward"), _get(result, "metrics")
        else:  # 0.1.5+: scores into the state
            args = (state, contextlib.nullcontext()) if self._call_style == "state+semaphore" else (state,)
            await _maybe_await(score_rollout(*args))
            reward, metrics = state.get("reward"), state.get("metrics")
        return _to_score(reward, metrics, self.name)

    def _event_loop(self) -> asyncio.AbstractEventLoop:
        with self._loop_lock:
            if self._loop is None or self._loop.is_closed():
                loop = asyncio.new_event_loop()
                threading.Thread(target=_run_loop, args=(loop,), daemon=True,
                                 name=f"rlvr-verifiers-{self.name}").start()
                self._loop = loop
            return self._loop

    def close(self) -> None:
        """Cancel what is still scoring and stop the private event loop (a later call starts a new one)."""
        with self._loop_lock:
            loop, self._loop = self._loop, None
        if loop is None or loop.is_closed():
            return
        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(_cancel_pending(), loop).result(5)
        loop.call_soon_threadsafe(loop.stop)

    # -------------------------------------------------------------------------------------- rows

    def rows(self, split: str = "train", n: int | None = None) -> list[dict[str, Any]]:
        """rlvr rows from the environment's ``dataset`` (``"train"``) or ``eval_dataset`` (``"eval"``)."""
        if split not in ("train", "eval"):
            raise ConfigError(f"VerifiersEnv.rows: split must be 'train' or 'eval', got {split!r}")
        dataset = getattr(self.env, "dataset" if split == "train" else "eval_dataset", None)
        if dataset is None:
            raise ConfigError(f"verifiers environment {self.name} has no {split} dataset")
        out = []
        for i, row in enumerate(_iter_rows(dataset)):
            if n is not None and i >= n:
                break
            out.append(self._row(row, i, split))
        return out

    def make_rows(self, n: int, *, seed: int = 0) -> list[dict[str, Any]]:
        """The first ``n`` training rows (``seed`` is ignored; see the module docs)."""
        if n < 0:
            raise ConfigError(f"VerifiersEnv.make_rows: n must be >= 0, got {n}")
        return self.rows("train", n)

    def _row(self, row: Mapping[str, Any], index: int, split: str) -> dict[str, Any]:
        where = f"verifiers environment {self.name} {split} row {index}"
        info = row.get("info") or {}
        if isinstance(info, str):
            try:
                info = json.loads(info)
            except ValueError:
                raise ConfigError(f"{where}: 'info' is a string but not JSON") from None
        if not isinstance(info, Mapping):
            raise ConfigError(f"{where}: 'info' must be a mapping or a JSON string")
        task = row.get("task") or "default"
        packed = {"answer": row.get("answer", "") or "", "info": dict(info), "task": task}
        prompt = row.get("prompt")
        if prompt is None and isinstance(row.get("question"), str):
            prompt = [{"role": "user", "content": row["question"]}]
        base = {"answer": packed, "info": {"source": "verifiers", "env": self.name, "split": split,
                                           "index": index, "task": task}}
        if isinstance(prompt, str):
            return {"prompt": prompt, **base}
        if isinstance(prompt, Sequence) and prompt:
            messages = [{k: v for k, v in dict(m).items() if v is not None} for m in prompt]
            return {"messages": messages, **base}
        raise ConfigError(f"{where}: needs a 'prompt' (messages or text) or a 'question'")

    def describe(self) -> dict[str, Any]:
        return {"type": f"{__name__}.VerifiersEnv", "env": self.name, "env_type": type(self.env).__qualname__,
                "message_type": self.message_type, "call_style": self._call_style}


def unpack_answer(answer: Any) -> tuple[Any, dict[str, Any], Any]:
    """``(answer, info, task)`` from a packed row answer, or ``(answer, {}, "default")``."""
    if isinstance(answer, Mapping) and set(answer) == _PACKED:
        info = answer["info"]
        return answer["answer"], dict(info) if isinstance(info, Mapping) else {}, answer["task"]
    return answer, {}, "default"


def split_messages(messages: Sequence[Mapping[str, Any]], message_type: str = "chat") -> tuple[Any, Any]:
    """verifiers' ``(prompt, completion)``: the messages before the first assistant message and the rest."""
    first = next((i for i, m in enumerate(messages) if m.get("role") == "assistant"), None)
    if first is None:
        raise ValueError("verifiers reward_fn: messages hold no assistant message; pass the conversation "
                         "including the model's reply")
    prompt = [dict(m) for m in messages[:first]]
    completion = [dict(m) for m in messages[first:]]
    if message_type == "completion":
        return "".join(str(m.get("content") or "") for m in prompt), "".join(
            str(m.get("content") or "") for m in completion if m.get("role") == "assistant")
    return prompt, completion


def _call_style(score_rollout: Any) -> str:
    try:
        params = [p for p in inspect.signature(score_rollout).parameters.values()
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    except (TypeError, ValueError):
        return "state"
    names = [p.name for p in params]
    if "prompt" in names and "completion" in names:
        return "kwargs"
    required = [p for p in params if p.default is p.empty]
    return "state+semaphore" if len(required) >= 2 else "state"


def _run_loop(loop: asyncio.AbstractEventLoop) -> None:
    asyncio.set_event_loop(loop)
    try:
        loop.run_forever()
    finally:
        loop.close()


async def _cancel_pending() -> None:
    tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


async def _maybe_await(value: Any) -> Any:
    return await value if inspect.isawaitable(value) else value


def _get(result: Any, key: str) -> Any:
    if isinstance(result, Mapping):
        return result.get(key)
    return getattr(result, key, None)


def _iter_rows(dataset: Any) -> Iterable[Mapping[str, Any]]:
    for row in dataset:
        if not isinstance(row, Mapping):
            raise ConfigError(f"verifiers dataset rows must be mappings, got {type(row).__name__}")
        yield row


def _to_score(reward: Any, metrics: Any, name: str) -> Score:
    if isinstance(reward, bool) or not isinstance(reward, (int, float)):
        raise TypeError(f"verifiers rubric of {name} produced reward {reward!r}; expected a float")
    components: dict[str, float] = {"reward": float(reward)}
    for key, value in dict(metrics or {}).items():
        components["metric/reward" if key == "reward" else str(key)] = value
    return Score(components, {"reward": 1.0})
