"""The rollout function a run uses, built the same way in the training process and in a worker.

:func:`rollout_fn_for` picks it for a setup: the section's own ``make_rollout_fn`` factory
(``task.rollout``), else multi-turn episodes when the environment plays several turns, else one
turn. :func:`served_rollout_fn` is what a remote rollout worker builds from a run's description
(all plain values: the tokenizer folder, the chat template's variables, the environment's section,
the sampling parameters and how to reach the servers), over a
:class:`~rlvr.backends.rollout.served.ServedGenerator`; so a row sampled remotely goes through the
very code it would locally.

A backend module: imports transformers (the tokenizer) and the environments.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from rlvr.backends.model.io import load_tokenizer
from rlvr.backends.model.tokenizer import HFChatTokenizer, use_chat_template
from rlvr.backends.rollout.served import ServedGenerator
from rlvr.envs.loading import load_object
from rlvr.envs.workers import load_env
from rlvr.errors import ConfigError
from rlvr.protocols import RolloutFn, RolloutSetup
from rlvr.rollouts.clock import clocked
from rlvr.rollouts.episodes import multi_turn, single_turn
from rlvr.types import SamplingParams


def rollout_fn_for(setup: RolloutSetup, *, rollout: str | None, max_turns: int, where: str = "task") -> RolloutFn:
    """``rollout``'s factory applied to ``setup``, else multi-turn episodes when asked for (or when the
    environment knows its own turn cap, as a verifiers MultiTurnEnv does), else one turn."""
    if rollout is not None:
        # The factory's generator waits are not its rollouts' own time either (rlvr.rollouts.clock).
        setup = dataclasses.replace(setup, generator=clocked(setup.generator))
        factory = load_object(rollout)
        if not callable(factory):
            raise ConfigError(f"{where}.rollout={rollout!r} is not a make_rollout_fn(setup) factory")
        fn = factory(setup)
        if not callable(fn):
            raise ConfigError(f"{where}.rollout={rollout!r} returned {type(fn).__name__}, not a rollout function")
        return fn
    turns = max_turns if max_turns > 1 else getattr(getattr(setup.env, "source", None), "default_max_turns", 1)
    if turns > 1:
        return multi_turn(setup, max_turns=turns)
    return single_turn(setup)


def tool_schemas(env: Any) -> Any:
    """The tools an environment renders into every prompt (a verifiers ToolEnv's), if any."""
    return getattr(getattr(env, "source", None), "tool_schemas", None)


def served_rollout_fn(*, tokenizer: str, env: Mapping[str, Any], params: Mapping[str, Any],
                      http: Mapping[str, Any], template_kwargs: Mapping[str, Any] | None = None,
                      rollout: str | None = None, max_turns: int = 1, chat_template: str | None = None) -> RolloutFn:
    """A run's rollout function in a worker: see the module docstring (``chat_template``: the run's
    ``model.chat_template``, its text)."""
    loaded = load_env(**dict(env))
    tok = use_chat_template(load_tokenizer(tokenizer), chat_template, "model.chat_template")
    chat = HFChatTokenizer(tok, template_kwargs=dict(template_kwargs or {}))
    generator = ServedGenerator(**dict(http))
    setup = RolloutSetup(generator=generator, tokenizer=chat.with_tools(tool_schemas(loaded)), env=loaded,
                         params=SamplingParams(**dict(params)))
    return rollout_fn_for(setup, rollout=rollout, max_turns=max_turns)
