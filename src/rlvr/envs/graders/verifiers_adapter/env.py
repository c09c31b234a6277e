"""A verifiers environment behind rlvr's contract: rows, ``reward_fn`` and, when multi-turn, ``interact``.

Invariants:
- verifiers' own code decides: the rubric scores (``score_rollout`` on a ``vf.State`` built as
  ``Environment.init_state`` builds it, then ``setup_state``), ``env_response`` answers,
  ``is_completed`` (the env's stop conditions) ends the episode, and the env's cleanup renders the
  completion before scoring, exactly as in a verifiers rollout.
- The state is verifiers' own: one trajectory step per model turn, so ``num_turns`` and the tool
  counts are real. A multi-turn episode's state (``env_response`` may keep keys in it) is found
  again when its conversation is scored; a conversation that never reached ``interact`` (one turn)
  gets a fresh state with its turns replayed into the trajectory.
- The reward is verifiers' reward, as a :class:`~rlvr.reward.Score` whose components are the
  rubric's functions with their weights (weight 0: a metric), so each appears as ``reward/<name>``.
"""

from __future__ import annotations

import contextlib
import copy
import inspect
import json
import math
import signal
import threading
import uuid
from collections import OrderedDict
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from rlvr.envs.graders.verifiers_adapter.messages import (
    content_text,
    gold_answer,
    pack_answer,
    split_messages,
    to_rlvr_message,
    to_vf_messages,
    tool_schemas,
    unpack_answer,
)
from rlvr.envs.graders.verifiers_adapter.runner import AsyncRunner
from rlvr.envs.import_check import check_import
from rlvr.errors import ConfigError, require_extra
from rlvr.reward import Score

EXTRA = "verifiers"
STATE_KEY = "verifiers_state"  # where interact keeps the episode's vf.State in rlvr's per-episode state
UNBOUNDED_TURNS = 16  # rlvr's cap for an environment with max_turns=-1 (task.max_turns overrides it)
_REMEMBERED = 4096  # episode states kept for scoring; a conversation scored later than this replays its turns


def from_verifiers(env: Any, *, timeout: float | None = None, **env_args: Any) -> VerifiersEnv:
    """Wrap a verifiers environment, or load an installed one by id with ``env_args`` and wrap it.

    ``timeout``: seconds one ``reward_fn`` or ``interact`` call may take (``None``: no bound).
    """
    if isinstance(env, str):
        check_import(env.replace("-", "_"))  # the module verifiers imports for this id (a worker's setup checks it)
        require_extra(EXTRA, "verifiers")
        import verifiers

        loader = getattr(verifiers, "load_environment", None)
        if not callable(loader):
            raise ConfigError(f"verifiers {getattr(verifiers, '__version__', '?')} has no load_environment for "
                              "classic environments (only verifiers.v1, which rlvr does not run); "
                              "install 'verifiers>=0.3,<0.4'")
        try:
            with _signal_handlers_kept():
                env = loader(env, **env_args)
        except ValueError as exc:  # verifiers' words for a module that does not import
            raise ConfigError(f"verifiers environment {env!r}: {exc} (install it, e.g. `vf-install {env}` or "
                              "`pip install` its package, or put its module on PYTHONPATH)") from exc
        except RuntimeError as exc:  # its load_environment raised (bad task.env_args among others)
            raise ConfigError(f"verifiers environment {env!r} with task.env_args={env_args!r}: {exc}") from exc
    elif env_args:
        raise ConfigError(f"from_verifiers: keyword arguments {sorted(env_args)} are only used when loading an "
                          "environment by id")
    multi = getattr(env, "max_turns", 1) != 1 and callable(getattr(env, "env_response", None))
    return (VerifiersMultiTurnEnv if multi else VerifiersEnv)(env, timeout=timeout)


def load_environment(env_id: str, **kwargs: Any) -> VerifiersEnv:
    """``task.env = "verifiers"`` with ``env_args = {env_id = ..., ...}``: the installed environment ``env_id``."""
    return from_verifiers(env_id, **kwargs)


class VerifiersEnv:
    """A single-turn verifiers environment (``SingleTurnEnv``, or any with ``max_turns = 1``)."""

    def __init__(self, env: Any, *, timeout: float | None = None) -> None:
        rubric: Any = getattr(env, "rubric", None)  # checked below: the classic verifiers shape
        if not callable(getattr(rubric, "score_rollout", None)) or not callable(getattr(env, "init_state", None)):
            raise ConfigError(f"{type(env).__name__} is not a classic verifiers environment (vf.SingleTurnEnv, "
                              "vf.MultiTurnEnv, vf.ToolEnv...); verifiers.v1 Env/Taskset environments are not "
                              "supported")
        if getattr(rubric, "has_group_rewards", False):
            names = [getattr(f, "__name__", repr(f)) for f in rubric._get_reward_funcs() if rubric._is_group_func(f)]
            raise ConfigError(f"the rubric of {type(env).__name__} has group-level reward functions {names}; "
                              "rlvr scores one rollout at a time, so they cannot run here")
        if getattr(env, "message_type", "chat") != "chat":
            raise ConfigError(f"{type(env).__name__} has message_type={env.message_type!r}; rlvr runs chat "
                              "environments (verifiers deprecates the completion type)")
        if timeout is not None and not timeout > 0:
            raise ConfigError(f"from_verifiers: timeout must be positive seconds or None, got {timeout!r}")
        self.env, self.rubric, self.timeout = env, rubric, timeout
        self.name = str(getattr(env, "env_id", None) or type(env).__name__)
        self.has_tools = bool(getattr(env, "tool_defs", None))
        self._runner = AsyncRunner(self.name)
        self._states: OrderedDict[str, Any] = OrderedDict()
        self._states_lock = threading.Lock()

    # ------------------------------------------------------------------------------------ reward

    def reward_fn(self, messages: Sequence[Mapping[str, Any]], answer: Any) -> Score:
        return self._runner.run(self.ascore(messages, answer), self.timeout, f"verifiers rubric of {self.name}")

    async def ascore(self, messages: Sequence[Mapping[str, Any]], answer: Any) -> Score:
        """The rubric's score for one conversation, for callers already in an event loop."""
        found = self._recall(messages, answer)
        state = copy.copy(found) if found is not None else await self._start(messages, answer)
        state["trajectory"] = list(state["trajectory"])
        await self._catch_up(state, messages)
        state["is_completed"] = True
        await self.env.cleanup(state)  # renders state["completion"] from the trajectory, as a rollout does
        await self.rubric.score_rollout(state)
        await self.rubric.cleanup(state)
        return self._score(state)

    async def _start(self, messages: Sequence[Mapping[str, Any]], answer: Any) -> Any:
        """A fresh vf.State for this row, built as ``Environment.init_state`` builds one, then ``setup_state``."""
        from verifiers.types import RolloutTiming, State, flatten_task_input

        prompt, _ = split_messages(messages)
        given = unpack_answer(answer)
        info = given.get("info") or {}
        if isinstance(info, str):
            info = json.loads(info)
        given = {**given, "info": info, "prompt": to_vf_messages(prompt, tools=False)}
        task = flatten_task_input(given)
        state = State(input=task)
        state["task"] = task
        state["prompt"] = given["prompt"]
        state.update(client=None, model=None, sampling_args=None, is_completed=False, is_truncated=False,
                     trajectory=[], completion=None, reward=None, metrics=None, error=None,
                     final_env_response=None, timing=RolloutTiming(), trajectory_id=uuid.uuid4().hex)
        state["tool_defs"] = self.env._normalize_tool_defs(info.get("tool_defs") or self.env.tool_defs) or []
        setup = await self.env.setup_state(state) if hasattr(self.env, "setup_state") else None
        return setup if setup is not None else state

    async def _catch_up(self, state: Any, messages: Sequence[Mapping[str, Any]]) -> None:
        """One trajectory step per assistant message not yet in ``state``'s trajectory."""
        turns = [i for i, m in enumerate(messages) if m.get("role") == "assistant"]
        for i in turns[len(state["trajectory"]):]:
            step = {"prompt": to_vf_messages(messages[:i], tools=self.has_tools),
                    "completion": to_vf_messages(messages[i:i + 1], tools=self.has_tools, start=i),
                    "response": None, "tokens": None, "reward": None, "advantage": None, "is_truncated": False,
                    "trajectory_id": state["trajectory_id"], "extras": {}}
            add = getattr(self.env, "add_trajectory_step", None)
            if add is not None:
                await add(state, step)
            else:
                state["trajectory"].append(step)

    def _score(self, state: Any) -> Score:
        reward, metrics = state.get("reward"), dict(state.get("metrics") or {})
        if isinstance(reward, bool) or not isinstance(reward, (int, float)):
            raise TypeError(f"verifiers rubric of {self.name} produced reward {reward!r}; expected a float")
        names = list(self.rubric._get_reward_func_names())
        weights = dict(zip(names, self.rubric._get_reward_weights(), strict=True))
        paid = {k: float(w) for k, w in weights.items() if k in metrics}
        weighted = math.fsum(w * float(metrics[k]) for k, w in paid.items())
        if len(set(names)) == len(names) and "reward" not in metrics and math.isclose(weighted, reward, abs_tol=1e-9):
            return Score({k: float(v) for k, v in metrics.items()}, paid or {next(iter(metrics)): 0.0})
        # The rubric's weights do not reproduce its reward (repeated names, a custom score_rollout):
        # pay the reward as one component and record the functions beside it.
        components = {("metric/reward" if k == "reward" else k): float(v) for k, v in metrics.items()}
        return Score({"reward": float(reward), **components}, {"reward": 1.0})

    def _remember(self, messages: Sequence[Mapping[str, Any]], answer: Any, state: Any) -> None:
        with self._states_lock:
            self._states[_key(messages, answer)] = state
            self._states.move_to_end(_key(messages, answer))
            while len(self._states) > _REMEMBERED:
                self._states.popitem(last=False)

    def _recall(self, messages: Sequence[Mapping[str, Any]], answer: Any) -> Any:
        # The episode ended either when interact returned [] (the whole conversation was remembered)
        # or with one more model turn after its last reply (rlvr's turn cap, a length stop).
        with self._states_lock:
            for end in (len(messages), len(messages) - 1):
                state = self._states.get(_key(messages[:end], answer))
                if state is not None:
                    return state
        return None

    def close(self) -> None:
        """Stop the private event loop (a later call starts a new one)."""
        self._runner.close()

    # -------------------------------------------------------------------------------------- rows

    def rows(self, split: str = "train", n: int | None = None) -> list[dict[str, Any]]:
        """rlvr rows from the environment's train dataset or its eval dataset, built on first use."""
        if split not in ("train", "eval"):
            raise ConfigError(f"verifiers rows: split must be 'train' or 'eval', got {split!r}")
        build = getattr(self.env, "build_dataset" if split == "train" else "build_eval_dataset", None)
        dataset = build() if callable(build) else getattr(self.env, "dataset" if split == "train" else "eval_dataset")
        if dataset is None:
            raise ConfigError(f"verifiers environment {self.name} has no {split} dataset"
                              + (" (use the train split: task.data = 'verifiers:ID')" if split == "eval" else ""))
        out = []
        for i, row in enumerate(dataset):
            if n is not None and i >= n:
                break
            out.append(self._row(row, i, split))
        return out

    def make_rows(self, n: int, *, seed: int = 0) -> list[dict[str, Any]]:
        """The first ``n`` training rows, in dataset order (the run's split and cursor are seeded already)."""
        if n < 0:
            raise ConfigError(f"verifiers make_rows: n must be >= 0, got {n}")
        return self.rows("train", n)

    def _row(self, row: Mapping[str, Any], index: int, split: str) -> dict[str, Any]:
        where = f"verifiers environment {self.name} {split} row {index}"
        if not isinstance(row, Mapping):
            raise ConfigError(f"{where}: rows must be mappings, got {type(row).__name__}")
        info = row.get("info") or {}
        if isinstance(info, str):
            try:
                info = json.loads(info)
            except ValueError:
                raise ConfigError(f"{where}: 'info' is a string but not JSON") from None
        if not isinstance(info, Mapping):
            raise ConfigError(f"{where}: 'info' must be a mapping or a JSON string")
        if info.get("tool_defs") is not None:
            raise ConfigError(f"{where}: per-row tools (info.tool_defs) are not supported; rlvr renders the "
                              "environment's tool_defs into every prompt")
        prompt = row.get("prompt")
        if isinstance(prompt, str):
            prompt = [{"role": "user", "content": prompt}]
        if not isinstance(prompt, Sequence) or not prompt:
            raise ConfigError(f"{where}: needs a 'prompt' (a list of messages)")
        messages = [{k: (content_text(v) if k == "content" else v) for k, v in dict(m).items() if v is not None}
                    for m in prompt]
        return {"messages": messages, "answer": pack_answer(row, info, index),
                "info": {"source": "verifiers", "env": self.name, "split": split, "index": index}}

    def sft_answer(self, answer: Any) -> str:
        """What a warm start teaches for a row: the dataset's ``answer`` column."""
        return str(gold_answer(answer))

    def describe(self) -> dict[str, Any]:
        tools = [t["function"]["name"] for t in self.tool_schemas or []]
        return {"type": f"{type(self).__module__}.{type(self).__name__}", "env": self.name,
                "env_type": type(self.env).__qualname__, "tools": tools, "max_turns": getattr(self.env, "max_turns", 1)}

    @property
    def tool_schemas(self) -> list[dict[str, Any]] | None:
        """The environment's tools as OpenAI function schemas: rendered into prompts by the chat template."""
        return tool_schemas(getattr(self.env, "tool_defs", None))


class VerifiersMultiTurnEnv(VerifiersEnv):
    """A multi-turn verifiers environment (``MultiTurnEnv``, ``ToolEnv``...): ``interact`` runs its turns."""

    def __init__(self, env: Any, *, timeout: float | None = None) -> None:
        super().__init__(env, timeout=timeout)
        for name in ("is_completed", "env_response"):
            if not inspect.iscoroutinefunction(getattr(env, name, None)):
                raise ConfigError(f"{type(env).__name__}.{name} is not a coroutine function; rlvr runs classic "
                                  "verifiers environments (verifiers>=0.3,<0.4)")

    @property
    def default_max_turns(self) -> int:
        """rlvr's turn cap when ``task.max_turns`` is left at 1: the environment's own ``max_turns``."""
        turns = getattr(self.env, "max_turns", -1)
        return turns if isinstance(turns, int) and turns > 0 else UNBOUNDED_TURNS

    def interact(self, messages: list[dict[str, Any]], state: dict[str, Any]) -> list[dict[str, Any]]:
        return self._runner.run(self._interact(messages, state), self.timeout, f"verifiers env_response of {self.name}")

    async def _interact(self, messages: list[dict[str, Any]], state: dict[str, Any]) -> list[dict[str, Any]]:
        vf_state = state.get(STATE_KEY)
        if vf_state is None:
            vf_state = state[STATE_KEY] = await self._start(messages, state["answer"])
        await self._catch_up(vf_state, messages)
        reply: list[dict[str, Any]] = []
        if not await self.env.is_completed(vf_state):
            out = await self.env.env_response(to_vf_messages(messages, tools=self.has_tools), vf_state)
            # A final_env_response ends the episode without another model turn; the rubric still
            # sees it, because the cleanup appends it to the rendered completion.
            if vf_state.get("final_env_response") is None:
                reply = [to_rlvr_message(m, self.name) for m in (out or [])]
        self._remember([*messages, *reply], state["answer"], vf_state)
        return reply


@contextlib.contextmanager
def _signal_handlers_kept() -> Iterator[None]:
    """Keep the process's SIGINT/SIGTERM handlers: a verifiers Environment replaces them when built
    (SIGTERM becomes ``exit(143)`` after its teardown), which would change how a run stops."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    kept = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in kept.items():
            if handler is not None:
                signal.signal(sig, handler)


def _key(messages: Sequence[Mapping[str, Any]], answer: Any) -> str:
    return json.dumps([list(messages), answer], sort_keys=True, default=str)
