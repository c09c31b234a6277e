"""Inference servers as Ray actors: :class:`ServerActor` owns one server process on its node, and
:class:`RayServer` is that server as the training process drives it.

:class:`RayServer` has what wiring and the weight-sync lanes use of a
:class:`~rlvr.backends.serve.process.ServerProcess` (``url``, ``model_name``, ``start``, ``stop``,
``exit_report``; ``model_dir``/``adapter``/``served_version`` set before a restart by the
kill-and-restart lane), so the server pool, the generators and the lanes are the same as for a
server started locally. The actor builds the server from a factory import path and its keyword
arguments (``rlvr serve`` or vLLM), on a free port of its node, and starts and stops it on request;
the server is started with ``--parent-pid`` of the actor, so it exits when its actor dies.

A server actor is never restarted by Ray (``max_restarts = 0``): a restarted server would come back
on another port with the base weights, so a dead one leaves the sampler pool instead, with the
actor's death as the reason (:meth:`RayServer.exit_report`), as a dead local server does.

A backend module: imports ray.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import ray
import ray.exceptions

from rlvr.backends.cluster.ray_rewards import actor_where
from rlvr.errors import BackendError

CALL_TIMEOUT_S = 10.0  # an actor's bookkeeping calls (not start, which waits for the server's health)


class ServerActor:
    """One inference server process on the actor's node (made a Ray actor class by :class:`RayServer`)."""

    def __init__(self, factory: str, kwargs: dict[str, Any], host: str | None):
        from rlvr.envs.loading import load_object

        self.server = load_object(factory)(host=host or ray.util.get_node_ip_address(), **kwargs)

    def info(self) -> tuple[str, str, dict[str, Any]]:
        return self.server.url, self.server.model_name, actor_where()

    def start(self, model_dir: str, adapter: str | None, served_version: int | None) -> str:
        self.server.model_dir, self.server.adapter, self.server.served_version = model_dir, adapter, served_version
        self.server.start()
        return self.server.url

    def stop(self) -> None:
        self.server.stop()

    def exit_report(self) -> str | None:
        return self.server.exit_report()


class RayServer:
    """A server process owned by a Ray actor placed by ``options``; see the module docstring."""

    def __init__(self, factory: str, kwargs: dict[str, Any], *, options: dict[str, Any], host: str | None,
                 startup_timeout_s: float, on_start: Callable[[dict[str, Any]], None]):
        self.startup_timeout_s = startup_timeout_s
        actor_class: Any = ray.remote(ServerActor)  # a Ray handle's ``.remote`` methods are untyped
        self.actor = actor_class.options(max_restarts=0, **options).remote(factory, kwargs, host)
        try:
            self.url, self.model_name, self.where = ray.get(self.actor.info.remote(), timeout=startup_timeout_s)
        except ray.exceptions.GetTimeoutError:
            self.kill()
            raise BackendError(f"the inference server actor was not placed within cluster.startup_timeout_s="
                               f"{startup_timeout_s:g}s: the Ray cluster lacks the CPUs asked for "
                               "(cluster.sampler_cpus each)") from None
        except ray.exceptions.RayError as exc:
            self.kill()
            raise BackendError(f"the inference server actor failed to start: {exc}") from None
        self.model_dir, self.served_version = str(kwargs.get("model_dir", "")), kwargs.get("served_version")
        self.adapter: str | None = kwargs.get("adapter")
        on_start({"role": "sampler", "name": f"server {self.url}", **self.where})

    def start(self) -> RayServer:
        """Start the server on the actor's node and wait for its health (the process's own bound)."""
        try:
            self.url = ray.get(self.actor.start.remote(self.model_dir, self.adapter, self.served_version))
        except ray.exceptions.RayTaskError as exc:
            raise BackendError(f"server {self.url} on node {self.where['ip']}: {exc.cause or exc}") from None
        except ray.exceptions.RayActorError as exc:
            raise BackendError(f"the Ray actor holding server {self.url} died: {exc}") from None
        return self

    def stop(self) -> None:
        """Stop the server process (bounded); the actor stays for a restart until the cluster closes."""
        try:
            ray.get(self.actor.stop.remote(), timeout=CALL_TIMEOUT_S)
        except ray.exceptions.RayError:
            pass  # the actor is gone, and its server with it (--parent-pid)

    def exit_report(self) -> str | None:
        """Why the server stopped answering: its process exited, or its actor died."""
        try:
            return ray.get(self.actor.exit_report.remote(), timeout=CALL_TIMEOUT_S)
        except ray.exceptions.GetTimeoutError:
            return None
        except ray.exceptions.RayActorError as exc:
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            return f"the Ray actor holding server {self.url} (node {self.where['ip']}, pid {self.where['pid']}) " \
                   f"died: {first}"

    def kill(self) -> None:
        try:
            ray.kill(self.actor, no_restart=True)
        except ray.exceptions.RayError:
            pass
