"""Rewards as TRL users write them: batch reward functions, and several functions with weights.

**A TRL reward** is ``fn(completions, **kwargs) -> list[float | None]``. TRL's ``GRPOTrainer`` calls it by
keyword, ``fn(prompts=..., completions=..., completion_ids=..., **columns)``, with one list entry per
sample and every dataset column but ``prompt`` as a keyword (so ``solution=[...]``). Prompts and
completions are strings for "standard" rows (a text prompt) and message lists for "conversational"
ones (``completions[i] == [{"role": "assistant", "content": ...}]``); ``None`` means "does not
apply". :class:`TrlReward` calls such a function unchanged, on a batch of one sample: rlvr scores each
sample off the event loop as it finishes, under ``loop.reward_timeout_s``, and a batch of one gives
the same numbers as TRL's batch for any function that scores samples independently (a reward that
compares samples across the batch is the one thing this does not reproduce). The columns are the row's
``info`` (every column but the prompt's, as TRL passes them, with or without ``task.fields``; a
``completion`` column is left out, as TRL leaves it), plus ``answer`` (the gold after
``task.answer_extract``) when no column of that name exists. The completion is the
last assistant turn; earlier turns belong to the prompt. ``completion_ids`` and ``trainer_state``
are not passed (rlvr rewards see text): a function that requires them is refused at load.

**Why a ``trl:`` prefix** rather than detection by signature: the calling convention differs in
kind (keywords, a batch, a list back), so the config says which one applies; a guess from parameter
names would misfire on an rlvr reward whose first parameter happens to be called ``completions``, and
on a ``(**kwargs)``-only function. The guess is still used, to refuse: loading a function that takes
``completions`` without the prefix fails at load naming the prefix to add
(:func:`~rlvr.envs.loading.check_reward_signature`), instead of failing on the first call.

**Several rewards** (``task.rewards`` + ``task.reward_weights``, TRL's ``reward_funcs`` +
``reward_weights``) give a :class:`~rlvr.reward.Score` whose components are the functions (each
recorded as ``reward/<name>``) and whose value is their weighted sum. As in TRL, a function that does
not apply to a sample (``None``) adds nothing to it; when none applies, the sample's reward is
``None`` (rlvr's "does not apply", where TRL would sum to 0).

Standard library only.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from rlvr.envs.loading import load_environment, load_object
from rlvr.errors import ConfigError, RewardError, safe_repr
from rlvr.protocols import LoadedEnv
from rlvr.reward import Score, call_reward, name_of
from rlvr.types import Message, Task

__all__ = ["TRL_PREFIX", "TrlReward", "needs_answer", "rewards_env", "trl_env"]

TRL_PREFIX = "trl:"
NOT_PASSED = ("completion_ids", "trainer_state")
# Columns TRL does not pass as keywords (a dataset's own "completion" column), and the names it passes itself.
NOT_COLUMNS = ("prompt", "prompts", "completion", "completions", "completion_ids")


class TrlReward:
    """A TRL reward function, called as ``GRPOTrainer`` calls it, on one sample at a time. Its
    ``reward_fn`` is marked ``takes_task``: :func:`rlvr.reward.call_reward` passes it the Task, where
    the prompt's format (standard or conversational) lives."""

    def __init__(self, fn: Callable[..., Any], where: str) -> None:
        if not callable(fn):
            raise ConfigError(f"reward {where}: a {type(fn).__name__} is not a function")
        self.fn, self.where = fn, where
        self.name = name_of(fn, where)
        try:
            signature = inspect.signature(fn)
        except (TypeError, ValueError):
            return
        params = signature.parameters
        takes_any = any(p.kind is p.VAR_KEYWORD for p in params.values())
        if "completions" not in params and not takes_any:
            raise ConfigError(f"reward {where}: a TRL reward takes completions= (and **kwargs); its signature "
                              f"is {signature}")
        for name in NOT_PASSED:
            if name in params and params[name].default is inspect.Parameter.empty:
                raise ConfigError(f"reward {where} requires {name!r}, which rlvr does not pass (its rewards see "
                                  f"text); give it a default or drop it")

    def reward_fn(self, messages: Sequence[Message], answer: Any, task: Task | None) -> float | None:
        prompt, completion = _split(messages, self.where)
        conversational = task.conversational if task is not None else True
        info = dict(task.info) if task is not None else {}
        columns = {k: v for k, v in {**({"answer": answer} if answer is not None else {}), **info}.items()
                   if k not in NOT_COLUMNS}
        if conversational:
            prompts: list[Any] = [prompt]
            completions: list[Any] = [[completion]]
        else:
            prompts = ["".join(str(m.get("content", "")) for m in prompt)]
            completions = [completion["content"]]
        out = self.fn(prompts=prompts, completions=completions, **{k: [v] for k, v in columns.items()})
        if not isinstance(out, (list, tuple)) or len(out) != 1:
            raise RewardError(f"TRL reward {self.where} returned {safe_repr(out)} for a batch of one sample; "
                              "a TRL reward returns a list with one float (or None) per completion")
        return out[0]

    reward_fn.takes_task = True  # type: ignore[attr-defined]
    reward_fn.needs_answer = False  # type: ignore[attr-defined]  # columns by keyword: an answer only if the row has one


def _split(messages: Sequence[Message], where: str) -> tuple[list[Message], Message]:
    for i in range(len(messages) - 1, -1, -1):
        if messages[i].get("role") == "assistant":
            return [dict(m) for m in messages[:i]], dict(messages[i])
    raise RewardError(f"TRL reward {where}: the conversation holds no assistant message to score")


def trl_env(spec: str) -> LoadedEnv:
    """The environment of one ``trl:`` reward spec (``trl:package.module:fn`` or ``trl:path/file.py:fn``)."""
    target = spec.removeprefix(TRL_PREFIX).strip()
    adapter = TrlReward(load_object(target), target)
    return LoadedEnv(name=adapter.name, reward_fn=adapter.reward_fn, spec=spec, source=adapter)


def reward_env(spec: str, load: Callable[[str], LoadedEnv] | None = None) -> LoadedEnv:
    """One entry of ``task.rewards``: a ``trl:`` function, else what ``load`` makes of it (an rlvr
    reward or environment; default :func:`~rlvr.envs.loading.load_environment`)."""
    if spec.startswith(TRL_PREFIX):
        return trl_env(spec)
    return (load or load_environment)(spec)


def rewards_env(specs: Sequence[str], weights: Sequence[float] | None = None,
                load: Callable[[str], LoadedEnv] | None = None) -> LoadedEnv:
    """Several rewards as one environment: a :class:`Score` with one weighted component per function
    (see the module doc). ``weights`` default to 1 each; a multi-turn environment is refused (its
    episodes would need its own ``task.env``)."""
    if not specs:
        raise ConfigError("task.rewards is empty; name at least one reward function")
    weights = [1.0] * len(specs) if weights is None else list(weights)
    if len(weights) != len(specs):
        raise ConfigError(f"task.reward_weights has {len(weights)} weights for {len(specs)} rewards; give one each")
    envs = [reward_env(spec, load) for spec in specs]
    for spec, env in zip(specs, envs, strict=True):
        if env.multi_turn:
            raise ConfigError(f"task.rewards: {spec!r} is a multi-turn environment; set it as task.env instead")
    names = _unique([env.name for env in envs])
    combined = WeightedRewards(dict(zip(names, envs, strict=True)), dict(zip(names, map(float, weights), strict=True)))
    return LoadedEnv(name="+".join(names), reward_fn=combined.reward_fn, spec=",".join(specs), source=combined)


class WeightedRewards:
    """``value = sum(weight * reward)`` over the rewards that apply; each reward a component."""

    def __init__(self, envs: Mapping[str, LoadedEnv], weights: Mapping[str, float]) -> None:
        self.envs, self.weights = dict(envs), dict(weights)

    def reward_fn(self, messages: Sequence[Message], answer: Any, task: Task | None) -> Score | None:
        components: dict[str, float] = {}
        metrics: dict[str, float] = {}
        for name, env in self.envs.items():
            out = call_reward(env.reward_fn, messages, answer, task)
            if out is None:
                continue
            if isinstance(out, Score):
                metrics.update({f"{name}/{k}": v for k, v in out.components.items()})
                out = out.value
            if isinstance(out, bool) or not isinstance(out, (int, float)) or not math.isfinite(out):
                raise RewardError(f"reward {name!r} returned {safe_repr(out)}; expected a finite float or None")
            components[name] = float(out)
        if not components:
            return None
        weights = {name: self.weights[name] for name in components}
        return Score({**metrics, **components}, weights)

    reward_fn.takes_task = True  # type: ignore[attr-defined]

    def needs_answer(self) -> bool:
        return any(needs_answer(env) for env in self.envs.values())


def needs_answer(env: LoadedEnv) -> bool:
    """Whether ``env``'s reward reads each row's ``answer``, so a row without one must be refused at load:
    not for TRL rewards (they take the row's columns by keyword), nor for a reward that gives ``answer``
    a default (``reward_fn(messages, answer=None)``) or says ``needs_answer = False``; yes otherwise
    (``reward_fn(messages, answer)`` compares with it)."""
    own = getattr(env.source, "needs_answer", None)
    if callable(own):
        return bool(own())
    fn = env.reward_fn
    if getattr(fn, "needs_answer", None) is False or getattr(env.source, "needs_answer", None) is False:
        return False
    try:
        positional = [p for p in inspect.signature(fn).parameters.values()
                      if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    except (TypeError, ValueError):
        return True
    return not (len(positional) >= 2 and positional[1].default is not inspect.Parameter.empty)


def _unique(names: list[str]) -> list[str]:
    out: list[str] = []
    for name in names:
        new, n = name, 1
        while new in out:
            n += 1
            new = f"{name}_{n}"
        out.append(new)
    return out
