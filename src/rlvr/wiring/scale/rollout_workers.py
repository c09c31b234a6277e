"""Remote rollout workers for a run: ``[cluster] rollout_workers = N`` (Ray actors) and
``rollout_urls = [...]`` (running ``rlvr rollout-worker`` processes).

:func:`start` makes the run's workers once (the Ray actors, in the ``rollout`` placement group); for
each environment :func:`remote_rollout_fn` then gives the loop a
:class:`~rlvr.rollouts.remote.RemoteRollouts` over every worker, each sent the environment's setup:
the run's rollout function described in plain values
(:func:`~rlvr.backends.rollout.setup.served_rollout_fn`: the tokenizer folder, chat-template
variables, the environment's section, sampling parameters, how to reach the servers). Every row
names the policy's servers as the training process's generator points at them when the row is sent
(:func:`~rlvr.backends.rollout.served.served_state`), so the workers sample the version the
trainer published. Part of the composition root; imports ray only for Ray workers.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlvr.backends.model.tokenizer import chat_template_text
from rlvr.config.run import RunConfig, TaskSection
from rlvr.errors import ConfigError
from rlvr.types import SamplingParams

ROW_GRACE_S = 60.0  # a row's bound beyond its samples' own (loop.rollout_timeout_s): transport and queueing
FACTORY = "rlvr.backends.rollout.setup:served_rollout_fn"


def wanted(cfg: RunConfig) -> bool:
    return cfg.cluster.rollout_workers > 0 or bool(cfg.cluster.rollout_urls)


@dataclass
class Fleet:
    """The run's workers: Ray actor slots and worker URLs."""

    ray: list[Any] = field(default_factory=list)
    urls: list[str] = field(default_factory=list)
    key_file: str | None = None  # holds the URL workers' key (cluster.rollout_key_file; None: $RLVR_API_KEY)


def start(cfg: RunConfig, closers: list[Callable[[], None]], log: Callable[[str], None] = print) -> Fleet | None:
    """The run's rollout workers, or ``None`` when it has none (rollouts run in this process)."""
    if not wanted(cfg):
        return None
    c = cfg.cluster
    check_key_file(c.rollout_key_file)
    fleet = Fleet(urls=list(c.rollout_urls), key_file=c.rollout_key_file)
    if c.rollout_workers:
        from rlvr.backends.cluster.ray_rollouts import rollout_actors
        from rlvr.wiring.scale.cluster import cluster

        on = cluster(cfg, log)

        def options(_name: str) -> dict[str, Any]:
            return {**on.options("rollout", c.rollout_workers, c.rollout_cpus), "max_restarts": c.max_restarts,
                    "max_task_retries": 0}

        fleet.ray = rollout_actors(c.rollout_workers, options=options, startup_timeout_s=c.startup_timeout_s,
                                   on_start=on.record)
        for worker in fleet.ray:
            on.kills.append(worker.kill)
            closers.append(worker.kill)
    where = [f"{len(fleet.ray)} Ray actor(s)"] * bool(fleet.ray) + [", ".join(fleet.urls)] * bool(fleet.urls)
    log(f"rollouts: run by remote workers ({'; '.join(where)}), sampling through the policy's server(s)")
    return fleet


def check_key_file(path: str | None) -> None:
    """``cluster.rollout_key_file``, when named, holds a key (its first line); read by each worker's client."""
    if path is None:
        return
    try:
        key = Path(path).expanduser().read_text().strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cluster.rollout_key_file={path!r}: cannot read it ({exc})") from None
    if not key:
        raise ConfigError(f"cluster.rollout_key_file={path!r} is empty; it holds the workers' key (the "
                          "URL_FILE.key an `rlvr rollout-worker --url-file URL_FILE` writes)")


def check_remote(section: TaskSection, agent: Any, name: str | None) -> None:
    """Refuse an environment played by an agent (``task.agent``, or a hub environment's own episode):
    its episodes go through the run's recording proxy in the training process, not a worker."""
    if agent is not None:
        where = "task" if name is None else f"envs.{name}"
        what = (f"{where}.agent={section.agent!r}" if section.agent else
                f"{where}.env={section.env!r} (a hub environment)")
        raise ConfigError(f"{what} is played by an agent through the run's recording proxy, which remote rollout "
                          "workers do not reach: drop cluster.rollout_workers / rollout_urls for this run")


def setup_spec(cfg: RunConfig, section: TaskSection, base: Path, params: SamplingParams) -> dict[str, Any]:
    """What a worker builds the section's rollout function from (plain values only)."""
    s = cfg.sampler
    template = {} if cfg.model.chat_template is None else {  # its text: a worker may not see the run's files
        "chat_template": chat_template_text(cfg.model.chat_template, "model.chat_template")}
    return {"factory": FACTORY, "kwargs": {**template,
        "tokenizer": str(Path(base).resolve()) if Path(base).exists() else str(base),
        "template_kwargs": cfg.template_kwargs(),
        "env": {"env": section.env, "name": section.name, "env_args": dict(section.env_args),
                "rewards": list(section.rewards), "reward_weights": section.reward_weights},
        "rollout": section.rollout, "max_turns": section.max_turns,
        "params": {"max_tokens": params.max_tokens, "temperature": params.temperature, "top_p": params.top_p},
        "http": {"max_concurrency": s.max_concurrency, "timeout_s": s.timeout_s, "retries": s.retries}}}


def remote_rollout_fn(fleet: Fleet, cfg: RunConfig, section: TaskSection, generator: Any, base: Path,
                      params: SamplingParams, name: str | None = None, log: Callable[[str], None] = print) -> Any:
    """The environment's rollout function, run by the fleet's workers."""
    from rlvr.backends.rollout.http_service import HTTPRolloutService
    from rlvr.backends.rollout.served import served_state
    from rlvr.rollouts.remote import RemoteRollouts

    spec = setup_spec(cfg, section, base, params)
    services: list[Any] = []
    if fleet.ray:
        from rlvr.backends.cluster.ray_rollouts import RayRolloutService

        services += [RayRolloutService(worker, spec) for worker in fleet.ray]
    for url in fleet.urls:
        service = HTTPRolloutService(url, spec, key_file=fleet.key_file)
        service.check()  # a wrong URL fails now, naming it, not at the first row
        services.append(service)
    timeout = cfg.loop.rollout_timeout_s
    return RemoteRollouts(services, servers=lambda: served_state(generator),
                          row_timeout_s=None if timeout is None else timeout + ROW_GRACE_S,
                          give_up_after_s=cfg.cluster.startup_timeout_s,
                          name="rollouts" if name is None else f"rollouts of {name}", log=log)
