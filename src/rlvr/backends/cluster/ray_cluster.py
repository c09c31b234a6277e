"""The run's Ray cluster: connected once, one placement group per role, every actor recorded.

:class:`RayCluster` joins the cluster at ``address`` or starts a local one (``ray.init``), makes a
placement group for each role the first time the role asks (one bundle of ``cpus`` per actor,
``SPREAD`` or ``PACK``), waits for it to be placed with a bound, and gives the options an actor of
that role is created with. It keeps, for the run record (:meth:`describe`), the cluster's address,
Ray's version, its nodes and the node and process of every actor started. :meth:`close` kills the
actors it started and, for a cluster it started, shuts Ray down.

Ray is process-wide state (one ``ray.init`` per process), so there is one :class:`RayCluster` per
process too (:func:`connect`). A local cluster gets the directory holding the ``rlvr`` package the
training process imported on its workers' ``PYTHONPATH``, so actors run this very code.

A backend module: imports ray.
"""

from __future__ import annotations

import atexit
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import ray
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

import rlvr
from rlvr.errors import BackendError

LOCAL_OBJECT_STORE_BYTES = 256 * 1024**2  # rewards and control calls are small; Ray's default takes 30% of RAM
_CURRENT: RayCluster | None = None
_LOCK = threading.Lock()


class RayCluster:
    """See the module docstring."""

    def __init__(self, *, address: str | None, num_cpus: int | None, placement: str, startup_timeout_s: float,
                 log: Callable[[str], None] = print):
        self.address, self.placement, self.startup_timeout_s, self.log = address, placement, startup_timeout_s, log
        self.started_here = False
        self.actors: list[dict[str, Any]] = []
        self.groups: dict[str, Any] = {}
        self.kills: list[Callable[[], None]] = []
        self._num_cpus = num_cpus

    def start(self, cpus_needed: float) -> RayCluster:
        """Join the cluster at ``address``, or start a local one with enough logical CPUs for the actors."""
        if ray.is_initialized():
            self.started_here = False
        elif self.address is not None:
            ray.init(address=self.address, log_to_driver=False)
        else:
            cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
            num_cpus = self._num_cpus or max(cores, int(-(-cpus_needed // 1)))
            package_root = str(Path(rlvr.__file__).resolve().parents[1])
            path = os.pathsep.join(p for p in (package_root, os.environ.get("PYTHONPATH", "")) if p)
            ray.init(num_cpus=num_cpus, include_dashboard=False, log_to_driver=False,
                     object_store_memory=LOCAL_OBJECT_STORE_BYTES,
                     runtime_env={"env_vars": {"PYTHONPATH": path}})
            self.started_here = True
            self.log(f"cluster: started a local Ray cluster ({num_cpus} CPUs, Ray {ray.__version__})")
        if not self.started_here:
            self.log(f"cluster: joined the Ray cluster at {self.gcs_address()} (Ray {ray.__version__}, "
                     f"{len(self.nodes())} nodes)")
        return self

    def gcs_address(self) -> str:
        return str(ray.get_runtime_context().gcs_address)

    def nodes(self) -> list[dict[str, Any]]:
        return [{"node_id": n["NodeID"], "ip": n["NodeManagerAddress"], "alive": bool(n["Alive"]),
                 "cpus": n.get("Resources", {}).get("CPU", 0.0)} for n in ray.nodes()]

    def options(self, role: str, count: int, cpus: float, *, strategy: str | None = None,
                resources: dict[str, float] | None = None) -> dict[str, Any]:
        """Options for one actor of ``role`` (whose group holds ``count`` actors of ``cpus`` each). A role
        may name its own ``strategy`` (else the configured placement) and ``resources`` every bundle adds."""
        group = self.groups.get(role)
        if group is None:
            strategy = strategy or ("SPREAD" if self.placement == "spread" else "PACK")
            group = placement_group([{"CPU": cpus, **(resources or {})}] * count, strategy=strategy)
            ready = group.ready()
            try:
                ray.get(ready, timeout=self.startup_timeout_s)
            except ray.exceptions.GetTimeoutError:
                remove_placement_group(group)
                raise BackendError(
                    f"cluster: the Ray cluster could not place {count} {role} actors of {cpus:g} CPUs each within "
                    f"cluster.startup_timeout_s={self.startup_timeout_s:g}s (its nodes: {self._cpus_text()}); "
                    f"lower cluster.{role.split(':')[0]}_cpus, add nodes, or set cluster.num_cpus") from None
            self.groups[role] = group
        return {"num_cpus": cpus, "scheduling_strategy": PlacementGroupSchedulingStrategy(group)}

    def _cpus_text(self) -> str:
        return ", ".join(f"{n['ip']} {n['cpus']:g} CPUs" for n in self.nodes() if n["alive"]) or "none alive"

    def record(self, actor: dict[str, Any]) -> None:
        self.actors.append(actor)

    def describe(self) -> dict[str, Any]:
        return {"backend": "ray", "address": self.gcs_address(), "requested_address": self.address,
                "started_here": self.started_here, "ray_version": ray.__version__, "nodes": self.nodes(),
                "placement": self.placement, "actors": list(self.actors)}

    def close(self) -> None:
        """Kill what this run started; shut down a cluster it started. Idempotent."""
        global _CURRENT
        kills, self.kills = self.kills, []
        for kill in kills:
            try:
                kill()
            except Exception:  # noqa: BLE001 - best effort: the cluster's shutdown takes the rest
                pass
        for group in self.groups.values():
            try:
                remove_placement_group(group)
            except Exception:  # noqa: BLE001 - best effort, as above
                pass
        self.groups = {}
        if self.started_here and ray.is_initialized():
            ray.shutdown()
        with _LOCK:
            if _CURRENT is self:
                _CURRENT = None


def connect(*, address: str | None, num_cpus: int | None, placement: str, startup_timeout_s: float,
            cpus_needed: float, log: Callable[[str], None] = print) -> RayCluster:
    """The process's cluster, joined or started on the first call; closed at interpreter exit after
    everything registered later (servers, pools), since ``atexit`` runs in reverse order."""
    global _CURRENT
    with _LOCK:
        if _CURRENT is None:
            cluster = RayCluster(address=address, num_cpus=num_cpus, placement=placement,
                                 startup_timeout_s=startup_timeout_s, log=log).start(cpus_needed)
            atexit.register(cluster.close)
            _CURRENT = cluster
        return _CURRENT


def current() -> RayCluster | None:
    return _CURRENT
