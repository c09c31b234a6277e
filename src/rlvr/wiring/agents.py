"""Agent episodes in a run (``[task] agent``, or a hub environment that plays its own episodes,
:mod:`rlvr.envs.hubs`): the recording proxy the run starts, and the rollout function that plays each
episode through it (:mod:`rlvr.rollouts.agents`).

One proxy per policy tokenizer and process, started on first use and stopped with the run's other
closers; training and held-out episodes share it, each session sampling from its own generator
(the run's sampler for training, the live engine for held-out) under its own rule (the run's
temperature, or greedy). Every closed episode is summarised in ``agents/sessions.jsonl`` of the run
folder: its row, phase, the server(s) that answered it, and per call the turn kind, segment,
version and token counts.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from rlvr.config.run import RunConfig, TaskSection
from rlvr.envs.loading import load_object
from rlvr.errors import ConfigError
from rlvr.protocols import RolloutSetup
from rlvr.rollouts.agents import agent_rollout

RECORD = Path("agents") / "sessions.jsonl"
_PROXIES: dict[int, Any] = {}  # id of the Hugging Face tokenizer -> its running proxy


def hub_agent(env: Any) -> Callable[..., Any] | None:
    """The episode a hub environment plays itself (:mod:`rlvr.envs.hubs`), if ``env`` is one."""
    return getattr(getattr(env, "source", None), "agent", None)


def uses_agents(cfg: RunConfig, envs: Mapping[str | None, Any]) -> bool:
    sections = list(cfg.envs.values()) if cfg.envs else [cfg.task]
    return any(section.agent is not None for section in sections) or any(hub_agent(e) for e in envs.values())


def check_agent_concurrency(cfg: RunConfig, envs: Mapping[str | None, Any]) -> None:
    """Refuse ``agent_concurrency`` on a section no agent plays (before anything is written or warm-started)."""
    for name, section in cfg.env_sections().items():
        if section.agent_concurrency is not None and section.agent is None and hub_agent(envs[name]) is None:
            where = "task" if name is None else f"envs.{name}"
            raise ConfigError(f"{where}.agent_concurrency = {section.agent_concurrency} bounds agent episodes, and "
                              f"this {'task' if name is None else 'environment'} has no agent ({where}.agent, or a "
                              "hub environment that plays its own)")


def agent_gateway(cfg: RunConfig, envs: Mapping[str | None, Any], tokenizer: Any, max_len: int | None,
                  run_dir: Path | None, closers: list[Callable[[], None]]) -> Any:
    """The run's recording proxy over ``tokenizer`` (an :class:`~rlvr.backends.model.tokenizer.HFChatTokenizer`),
    started once; ``None`` when no environment of the run is played by an agent."""
    if not uses_agents(cfg, envs):
        return None
    key = id(tokenizer.tokenizer)
    proxy = _PROXIES.get(key)
    if proxy is None:
        from rlvr.backends.proxy.app import AgentProxy  # fastapi, uvicorn: only for runs with agents

        proxy = AgentProxy(tokenizer.tokenizer, template_kwargs=tokenizer.template_kwargs, max_len=max_len,
                           budget=cfg.completion_budget, record=run_dir / RECORD if run_dir else None,
                           tool_parser=cfg.model.tool_parser)
        proxy.start()
        _PROXIES[key] = proxy

        def stop() -> None:
            _PROXIES.pop(key, None)
            proxy.stop()

        closers.append(stop)
    return proxy


def agent_of(task: TaskSection, env: Any) -> Callable[..., Any] | None:
    """``task.agent``'s function, else the hub environment's own episode, else ``None``."""
    if task.agent is None:
        return hub_agent(env)
    try:
        run = load_object(str(task.agent))
    except ConfigError as exc:
        raise ConfigError(f"task.agent: {exc}") from None
    if not callable(run):
        raise ConfigError(f"task.agent={task.agent!r} is not a function run(base_url, row)")
    return run


def agent_rollout_fn(run: Callable[..., Any], setup: RolloutSetup, max_episodes: int | None = None) -> Any:
    """Episodes of ``run`` through the proxy in ``setup.extras["agent_gateway"]``, at most ``max_episodes``
    at once."""
    gateway = setup.extras.get("agent_gateway")
    if gateway is None:
        raise ConfigError(f"the agent {getattr(run, '__qualname__', run)!r}: no recording proxy was started for "
                          "this run")
    return agent_rollout(setup, run, gateway, phase=str(setup.extras.get("agent_phase", "train")),
                         max_episodes=max_episodes)
