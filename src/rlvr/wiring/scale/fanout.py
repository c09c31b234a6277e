"""Several inference servers for one run: ``[sampler] url = [...]`` or ``[sampler] replicas = N``.

Each server is wired exactly as a single one is (:func:`rlvr.wiring.seams.sampler_side` with that one
URL, or with none so that rlvr starts it), in a folder of its own under the run
(``servers/r{i}/``: its ``sync/`` folder and ``server.log``); the generators become one
:class:`~rlvr.backends.sample.pool.ServerPool` and the lanes one
:class:`~rlvr.backends.sync.fanout.FanoutLane`, so the loop sees one generator and one lane.
Part of the composition root.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rlvr.config.run import RunConfig

SERVERS_DIR = "servers"


def several_servers(cfg: RunConfig) -> bool:
    s = cfg.sampler
    return s.backend != "in_process" and (isinstance(s.url, list) or s.replicas > 1)


def pooled_sampler_side(cfg: RunConfig, policy: Any, base: Path, run_dir: Path | None, one: Callable[..., Any],
                        log: Callable[[str], None] = print) -> tuple[Any, Any, list[Callable[[], None]]]:
    """The pool over every server, the lane that publishes to all of them, and what to close at exit;
    ``one(cfg, policy, base, folder)`` wires a single server (``sampler_side``)."""
    from rlvr.backends.sample.pool import ServerPool
    from rlvr.backends.sync.fanout import FanoutLane

    s = cfg.sampler
    urls: list[str | None] = list(s.url) if isinstance(s.url, list) else [None] * s.replicas
    folder = run_dir if run_dir is not None else Path(tempfile.mkdtemp(prefix="rlvr-servers-"))
    generators: list[Any] = []
    lanes: list[Any] = []
    closers: list[Callable[[], None]] = []
    try:
        for i, url in enumerate(urls):
            single = cfg.model_copy(update={"sampler": s.model_copy(update={"url": url, "replicas": 1})})
            generator, lane, close = one(single, policy, base, folder / SERVERS_DIR / f"r{i}")
            generators.append(generator)
            lanes.append(lane)
            closers += close
    except BaseException:
        for close in closers:
            close()
        raise
    where = ", ".join(str(g.url) for g in generators)
    log(f"sampler: {len(generators)} servers ({where}), at most {s.max_concurrency} requests in flight each")
    pool = ServerPool(generators, per_server=s.max_concurrency, log=log)
    return pool, FanoutLane(pool, lanes), closers


def with_reward_workers(cfg: RunConfig, envs: dict[str | None, Any],
                        closers: list[Callable[[], None]]) -> dict[str | None, Any]:
    """Each environment whose section sets ``reward_workers = N`` with its reward run in ``N`` worker
    processes (:class:`~rlvr.envs.workers.RewardWorkers`), or ``N`` Ray actors with
    ``cluster.backend = "ray"`` (:mod:`rlvr.wiring.scale.cluster`), each loading the environment from the
    section; the others as they are. The pools are stopped by ``closers``."""
    import dataclasses

    from rlvr.envs.workers import RewardWorkers

    out = {}
    for name, env in envs.items():
        t = cfg.env_sections()[name]
        if t.reward_workers == 0:
            out[name] = env
            continue
        spec = ("rlvr.envs.workers:load_env", {"env": t.env, "name": t.name, "env_args": dict(t.env_args),
                                               "rewards": list(t.rewards), "reward_weights": t.reward_weights})
        if cfg.cluster.backend == "ray":  # the same reward, in actors the Ray cluster places and restarts
            from rlvr.wiring.scale.cluster import reward_workers

            workers = reward_workers(cfg, name, spec, t.reward_workers)
        else:
            workers = RewardWorkers(spec, workers=t.reward_workers, timeout_s=cfg.loop.reward_timeout_s)
        closers.append(workers.close)
        out[name] = dataclasses.replace(env, reward_fn=workers)
    return out
