"""``rlvr train``/``resume --nproc N`` with ``[cluster] backend = "ray"``: trainer ranks 1..N-1 as Ray
actors, this process as rank 0.

:func:`join` (instead of running torchrun) places the other ranks in a ``trainer`` placement group
(one bundle of ``cluster.trainer_cpus`` CPUs per rank; on a CUDA device ``STRICT_PACK`` on this
process's node, whose GPU ``r`` rank ``r`` uses, as torchrun's local ranks do; otherwise the
configured placement), records each actor in ``run.json``'s ``cluster.actors`` (role ``trainer``),
starts their serve loop (:func:`rlvr.wiring.scale.ranks.serve`, the one torchrun's ranks run) and joins the
group as rank 0 with ``MASTER_ADDR`` = this node's address (loopback on a local cluster) and a free
port. Rank 0's waits on the group are bounded by ``cluster.rank_timeout_s``; the other ranks wait
as long as rank 0 samples and evaluates. From then on the run is the one torchrun starts: rank 0
owns the loop and the record. :func:`distributed` is rank 0's trainer seam, watched
(:mod:`rlvr.backends.cluster.rank_watch`) when the ranks are actors.

Part of the composition root; imports ray only once a run asks for ranks on it.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable
from datetime import timedelta
from functools import partial
from typing import Any

from rlvr.config.run import RunConfig
from rlvr.errors import BackendError, ConfigError, UsageError
from rlvr.wiring.scale import cluster
from rlvr.wiring.scale.ranks import serve

_RANKS: Any = None  # this process's rank actors (a RayRanks), once join() placed them


def placement(count: int, cfg: RunConfig, node_ip: str) -> tuple[str | None, dict[str, float]]:
    """The ``trainer`` group's strategy and extra bundle resources: NCCL ranks share rank 0's node
    (``STRICT_PACK``, each bundle holding a share of the node's ``node:IP`` resource); gloo ranks go
    where ``cluster.placement`` puts them (``None``: the configured strategy)."""
    if cfg.model.device.startswith("cuda"):
        return "STRICT_PACK", {f"node:{node_ip}": 1.0 / (count + 1)}
    return None, {}


def check(cfg: RunConfig, nproc: int, env: dict[str, str] | None = None, gpus: int | None = None) -> None:
    """Refuse what cannot run as asked, before a cluster is started."""
    env = dict(os.environ) if env is None else env
    if nproc < 1:
        raise UsageError(f"--nproc {nproc}: give the number of trainer ranks, 1 or more")
    if "WORLD_SIZE" in env:
        raise UsageError("--nproc with cluster.backend = 'ray' inside torchrun: torchrun already started the ranks; "
                         "drop --nproc (the servers and reward workers still go on Ray), or run rlvr without torchrun")
    if cfg.train.token_export and nproc > 1:
        raise ConfigError("train.token_export with trainer ranks as Ray actors: each rank writes its part into the "
                          "run folder, which an actor on another node cannot reach; run the ranks under torchrun "
                          "(cluster.backend = 'local') or turn the export off")
    if cfg.model.device.startswith("cuda") and gpus is not None and nproc > gpus:
        raise ConfigError(f"--nproc {nproc} with model.device = {cfg.model.device!r}: trainer rank r uses GPU r of "
                          f"this node (the ranks share it, as under torchrun), and it has {gpus}; lower --nproc")


def join(cfg: RunConfig, nproc: int, log: Callable[[str], None] = print) -> Any:
    """Ranks 1..``nproc``-1 on the cluster and this process joined as rank 0: its
    :class:`~rlvr.backends.train.distributed.Ranks`; ``None`` for one rank (nothing to place)."""
    global _RANKS
    gpus = None
    if cfg.model.device.startswith("cuda"):
        import torch

        gpus = torch.cuda.device_count()
    check(cfg, nproc, gpus=gpus)
    if nproc == 1:
        return None
    c = cfg.cluster
    on = cluster.cluster(cfg, log, extra_cpus=(nproc - 1) * c.trainer_cpus)
    import ray

    from rlvr.backends.cluster.ray_ranks import RayRanks

    node_ip = next(n["ip"] for n in on.nodes() if n["node_id"] == ray.get_runtime_context().get_node_id())
    master = "127.0.0.1" if c.address is None else node_ip  # a local cluster stays on loopback
    strategy, resources = placement(nproc - 1, cfg, node_ip)
    options = on.options("trainer", nproc - 1, c.trainer_cpus, strategy=strategy, resources=resources)
    ranks = RayRanks(nproc - 1, options=options, startup_timeout_s=c.startup_timeout_s,
                     on_start=on.record)
    on.kills.append(ranks.kill)
    port = _free_port(master)
    ranks.serve({"world_size": nproc, "master_addr": master, "master_port": port, "cwd": os.getcwd(),
                 "device": cfg.model.device, "visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES")},
                partial(serve, cfg))
    try:
        group = _join_as_rank0(cfg, nproc, master, port)
    except Exception as exc:
        from rlvr.backends.cluster.rank_watch import LOST_WAIT_S, lost_message

        lost = ranks.lost(LOST_WAIT_S)
        why = lost_message(lost, "while joining") if lost else f"{exc}".strip().splitlines()[0]
        raise BackendError(f"trainer ranks on Ray could not form the process group within cluster.rank_timeout_s="
                           f"{c.rank_timeout_s:g}s: {why}") from exc
    _RANKS = ranks
    log(f"cluster: trainer ranks 1..{nproc - 1} are Ray actors ("
        + ", ".join(f"rank {r['rank']} on {r['ip']} pid {r['pid']}" for r in ranks.describe())
        + f"); this process is rank 0, {group.backend} on {master}:{port}")
    return group


def _join_as_rank0(cfg: RunConfig, nproc: int, master: str, port: int) -> Any:
    import torch.distributed as dist

    from rlvr.backends.train.distributed import Ranks, start_ranks

    os.environ.update(MASTER_ADDR=master, MASTER_PORT=str(port))
    # Joined here rather than in start_ranks, for a bound of rank 0's own: the other ranks wait in a
    # broadcast while rank 0 samples, but rank 0 only waits on them for a join or a step's reduce.
    backend = "nccl" if cfg.model.device.startswith("cuda") else "gloo"
    dist.init_process_group(backend, rank=0, world_size=nproc, timeout=timedelta(seconds=cfg.cluster.rank_timeout_s))
    return start_ranks(Ranks(0, nproc, 0, ""), cfg.model.device)


def _free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def distributed(trainer: Any, ranks: Any) -> Any:
    """Rank 0's data-parallel trainer seam over ``trainer`` (a RankTrainer); watched when the other
    ranks are Ray actors this process placed."""
    from rlvr.backends.train.distributed import DistributedTrainer

    if _RANKS is None:
        return DistributedTrainer(trainer, ranks)
    from rlvr.backends.cluster.rank_watch import WatchedTrainer

    return WatchedTrainer(lambda: DistributedTrainer(trainer, ranks), _RANKS)
