"""``[cluster] backend = "ray"``: the inference servers and reward workers rlvr starts, as Ray actors.

With the Ray backend, :func:`make_server` puts each server rlvr starts (``sampler.replicas``, or the
one server of ``backend = "http"``/``"vllm"`` without ``url``) in an actor of the ``sampler``
placement group, and :func:`reward_workers` runs each ``reward_workers = N`` section's reward in
``N`` actors of a ``reward:NAME`` group; everything else (the server pool, the fan-out lane, the
loop) is built exactly as for local processes. :func:`cluster_record` is what ``run.json`` says
about the cluster. Part of the composition root; imports ray only when the config asks for it.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import Any

from rlvr.config.run import RunConfig
from rlvr.errors import MissingExtraError

SERVER_FACTORIES = {"http": "rlvr.backends.serve.process:ServerProcess",
                    "vllm": "rlvr.backends.serve.vllm:VLLMServer",
                    "sglang": "rlvr.backends.serve.sglang:SGLangServer"}


def on_ray(cfg: RunConfig) -> bool:
    return cfg.cluster.backend == "ray"


def cpus_needed(cfg: RunConfig) -> float:
    """Logical CPUs the run's actors reserve: its servers, every section's reward workers, its rollout workers."""
    c, s = cfg.cluster, cfg.sampler
    servers = s.replicas if s.starts_servers else 0
    sections = [cfg.task] if not cfg.envs else list(cfg.envs.values())
    return (servers * c.sampler_cpus + sum(t.reward_workers for t in sections) * c.reward_cpus
            + c.rollout_workers * c.rollout_cpus)


# On Linux, Ray advertises a local cluster at the machine's network address; with this off it uses
# loopback, as every server rlvr starts does. Read when ray is imported, so set before that.
LOCAL_ONLY = ("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")


def cluster(cfg: RunConfig, log: Callable[[str], None] = print, extra_cpus: float = 0.0) -> Any:
    """The run's :class:`~rlvr.backends.cluster.ray_cluster.RayCluster`, joined or started once. A local
    cluster (no ``cluster.address``) is kept on loopback (:data:`LOCAL_ONLY`), unless ray was imported
    before rlvr could say so: then it is where Ray puts it, and the log says so. ``extra_cpus``: what
    actors other than the config's servers and reward workers reserve (trainer ranks), sizing a local cluster."""
    if cfg.cluster.address is None:
        if "ray" in sys.modules and os.environ.get(LOCAL_ONLY[0]) != LOCAL_ONLY[1]:
            log(f"cluster: ray was imported before the run started, so the local cluster uses this machine's "
                f"network address rather than loopback (set {LOCAL_ONLY[0]}={LOCAL_ONLY[1]} before importing ray)")
        os.environ.setdefault(*LOCAL_ONLY)
    try:
        from rlvr.backends.cluster import ray_cluster
    except ImportError as exc:
        raise MissingExtraError(f"cluster.backend = 'ray' needs Ray ({exc}): pip install 'rlvr[ray]'") from None
    c = cfg.cluster
    return ray_cluster.connect(address=c.address, num_cpus=c.num_cpus, placement=c.placement,
                               startup_timeout_s=c.startup_timeout_s, cpus_needed=cpus_needed(cfg) + extra_cpus,
                               log=log)


def prepare(cfg: RunConfig, log: Callable[[str], None] = print) -> None:
    """Before any server is wired: the cluster, and the ``sampler`` group sized for every server rlvr
    starts (each server is then wired on its own, from a config that names only itself)."""
    c, s = cfg.cluster, cfg.sampler
    on = cluster(cfg, log)
    if s.starts_servers:
        on.options("sampler", s.replicas, c.sampler_cpus)


def make_server(cfg: RunConfig, kwargs: dict[str, Any]) -> Any:
    """A server rlvr starts, owned by a Ray actor in the ``sampler`` placement group. On a local
    cluster it listens on loopback; on a cluster at ``address``, on its node's address."""
    from rlvr.backends.cluster.ray_servers import RayServer

    on = cluster(cfg)
    options = on.options("sampler", cfg.sampler.replicas, cfg.cluster.sampler_cpus)
    server = RayServer(SERVER_FACTORIES[cfg.sampler.backend], kwargs, options=options,
                       host="127.0.0.1" if cfg.cluster.address is None else None,
                       startup_timeout_s=cfg.cluster.startup_timeout_s, on_start=on.record)
    on.kills.append(server.kill)
    return server


def reward_workers(cfg: RunConfig, name: str | None, spec: tuple[str, dict[str, Any]], workers: int,
                   log: Callable[[str], None] = print) -> Any:
    """``workers`` reward actors for one section (``name``: its ``[envs.NAME]``, ``None`` for ``[task]``),
    restarted by Ray up to ``cluster.max_restarts`` times, the call they were running retried once."""
    from rlvr.backends.cluster.ray_rewards import reward_pool

    on, c = cluster(cfg, log), cfg.cluster
    role = "reward" if name is None else f"reward:{name}"

    def options(_actor: str) -> dict[str, Any]:
        return {**on.options(role, workers, c.reward_cpus), "max_restarts": c.max_restarts, "max_task_retries": 1}

    pool = reward_pool(spec, workers=workers, timeout_s=cfg.loop.reward_timeout_s, options=options,
                       startup_timeout_s=c.startup_timeout_s, on_start=on.record, log=log)
    on.kills.append(pool.close)
    return pool


def cluster_record(cfg: RunConfig) -> dict[str, Any]:
    """``run.json``'s ``cluster``: the backend; for Ray its address, version, nodes and every actor's node."""
    return cluster(cfg).describe() if on_ray(cfg) else {"backend": "local"}
