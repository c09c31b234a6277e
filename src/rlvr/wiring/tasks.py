"""A run's rows and environments from its ``[task]`` or ``[envs.*]`` sections: the corpus read once,
each section's environment loaded, and the rollout function a section plays its rows with.
Imports the backends lazily where a rollout function needs them."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from rlvr.backends.model.tokenizer import HFChatTokenizer
from rlvr.backends.rollout.setup import rollout_fn_for
from rlvr.config.run import RunConfig, TaskSection
from rlvr.data.readers import read_tasks, spec_label
from rlvr.data.tasks import load_tasks
from rlvr.envs import environment, procedural_task
from rlvr.envs.graders.verifiers_adapter import is_verifiers_spec, verifiers_tasks
from rlvr.envs.trl import needs_answer, rewards_env
from rlvr.errors import ConfigError
from rlvr.protocols import LoadedEnv, RolloutSetup
from rlvr.rollouts.episodes import prompt_ids_of
from rlvr.session import is_session_spec
from rlvr.types import Split, Task
from rlvr.wiring.agents import agent_of, agent_rollout_fn
from rlvr.wiring.fields import field_map
from rlvr.wiring.reward_models import reward_loader


def run_tasks(cfg: RunConfig) -> tuple[list[Task], dict[str | None, LoadedEnv]]:
    """The run's corpus and its environments by the name their rows carry (``{None: env}`` for a
    run of one environment, :meth:`~rlvr.config.run.RunConfig.env_sections`)."""
    if cfg.envs:
        tasks, several = envs_tasks(cfg)
        envs: dict[str | None, LoadedEnv] = {name: env for name, env in several.items()}
        return tasks, envs
    tasks, one = task_tasks(cfg)
    return tasks, {None: one}


def task_tasks(cfg: RunConfig) -> tuple[list[Task], LoadedEnv]:
    """The corpus, as tasks validated once, and the environment ``[task]`` names (see
    :class:`~rlvr.config.sections.TaskSection`)."""
    return section_tasks(cfg.task, cfg.model.device)


def envs_tasks(cfg: RunConfig) -> tuple[list[Task], dict[str, LoadedEnv]]:
    """A run of several environments: every environment's rows, each tagged with its environment
    and its id prefixed by the environment's name (``addition/17``), so ids stay unique."""
    tasks: list[Task] = []
    envs: dict[str, LoadedEnv] = {}
    for name, section in cfg.envs.items():
        try:
            rows, envs[name] = section_tasks(section, cfg.model.device)
        except ConfigError as exc:
            raise ConfigError(f"[envs.{name}]: {exc}") from None
        tasks += [dataclasses.replace(t, id=f"{name}/{t.id}", env=name) for t in rows]
    return tasks, envs


def section_tasks(t: TaskSection, device: str = "cpu") -> tuple[list[Task], LoadedEnv]:
    """One environment's rows (``data``, else its own ``make_rows``, else the procedural task) and the
    environment itself (its ``rm:`` rewards on ``device``, the policy's)."""
    env = rewards_env(t.rewards, t.reward_weights, load=reward_loader(device)) if t.rewards else environment(
        t.env or t.name, **t.env_args)  # type: ignore[arg-type]
    if t.max_turns > 1 and not env.multi_turn and t.rollout is None:
        raise ConfigError(f"task.max_turns={t.max_turns} needs an environment with interact(); "
                          f"{env.name!r} has none")
    fields = field_map(t)
    if t.data is not None and is_verifiers_spec(t.data):
        if fields is not None:
            raise ConfigError(f"task.fields / task.answer_extract: rows from {t.data!r} come in the verifiers "
                              "environment's own shape; remove them")
        return verifiers_tasks(t.data, env), env
    if t.data is not None:  # prompt-only rows are fine for a reward that takes no answer (TRL's)
        return read_tasks(t.data, fields=fields, max_row_bytes=t.max_row_bytes(),
                          require_answer=needs_answer(env)), env
    make_rows = env.make_rows if t.env is not None and env.make_rows is not None else None
    if make_rows is None:
        if t.name is None:
            raise ConfigError(f"environment {env.name!r} makes no rows: set task.data or task.name")
        make_rows = procedural_task(t.name)[0]
    try:
        rows = make_rows(t.n, seed=t.seed, **t.params)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"task.params={t.params!r}: the rows of {t.name or env.name!r} cannot be made with them "
                          f"({exc})") from None
    return load_tasks(rows, fields=fields, require_answer=needs_answer(env)), env


def data_source(t: TaskSection, env: LoadedEnv) -> str:
    """Where a section's rows came from, as the run's record and model card name it (the choice
    :func:`section_tasks` makes; no path of this machine: :func:`~rlvr.data.readers.spec_label`)."""
    if t.data is not None:
        return spec_label(t.data)
    if t.env is not None and env.make_rows is not None:
        return f"rows made by the environment {env_label(t.env)} (n = {t.n}, seed = {t.seed})"
    return f"procedural task {t.name!r} (n = {t.n}, seed = {t.seed})"


def env_label(spec: str) -> str:
    """An environment spec without this machine's paths: a file by its name (and attribute)."""
    if is_session_spec(spec):
        return "given to rlvr.train"
    base, sep, attr = spec.rpartition(":")
    location, suffix = (base, f":{attr}") if sep and base else (spec, "")
    if location.endswith(".py") or "/" in location:
        return Path(location).name + suffix
    return spec


def make_rollout_fn(task: TaskSection, setup: RolloutSetup) -> Any:
    """``task.agent``'s episodes, else ``task.rollout``'s factory, else multi-turn episodes when asked
    for, else one turn (the choice a remote rollout worker makes too, agents aside:
    :func:`~rlvr.backends.rollout.setup.rollout_fn_for`)."""
    agent = agent_of(task, setup.env)
    if agent is not None:
        return agent_rollout_fn(agent, setup, task.agent_concurrency)
    return rollout_fn_for(setup, rollout=task.rollout, max_turns=task.max_turns)


def check_prompts(split: Split, tokenizer: HFChatTokenizer, model_config: Any, max_new_tokens: int) -> None:
    """Refuse, at load, a row whose prompt the model cannot take: longer than its context with the
    completion budget added, or token ids outside its vocabulary. Never truncated silently."""
    context = int(getattr(model_config, "max_position_embeddings", 0) or 0)
    vocab = int(getattr(model_config, "vocab_size", 0) or 0)
    for side, tasks in (("training", split.train), ("held-out", split.heldout)):
        for task in tasks:
            ids = prompt_ids_of(task, tokenizer)
            if context and len(ids) + max_new_tokens > context:
                raise ConfigError(f"{side} row {task.id!r}: its prompt is {len(ids)} tokens, and with "
                                  f"sampler.max_new_tokens={max_new_tokens} that exceeds the model's context of "
                                  f"{context}; shorten the row, drop it from the data, or lower max_new_tokens")
            if vocab and max(ids) >= vocab:
                raise ConfigError(f"{side} row {task.id!r}: info.prompt_ids holds token id {max(ids)}, outside the "
                                  f"model's vocabulary of {vocab}")
