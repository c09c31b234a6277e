"""The in-process lane: weight sync for the in-process engine (:mod:`rlvr.backends.sample.engine`).

Nothing to copy when the engine samples the live model; a replica engine is handed the trainable
weights, which its worker loads between two generation batches. Like every lane it checks the
version served afterwards. A backend module: imports nothing heavy itself.
"""

from __future__ import annotations

from typing import Any

from rlvr.errors import BackendError


class InProcessLane:
    """For the in-process engine. ``engine=None`` or a live-model engine: nothing to copy (the
    engine reads the live version, which must already be ``version``). With ``policy`` given the
    engine is a replica: its trainable weights are published to it."""

    lane = "in_process"

    def __init__(self, engine: Any = None, policy: Any = None):
        self.engine, self.policy = engine, policy

    def __call__(self, version: int) -> int:
        if self.engine is None:
            return version
        if self.policy is None:
            served = self.engine.version
        else:
            weights = {n: p for n, p in self.policy.model.named_parameters() if p.requires_grad}
            served = self.engine.publish(weights, version)
        if served != version:
            raise BackendError(f"in-process engine serves policy version {served} after publishing version {version}: "
                              "the engine is stale")
        return served

    def describe(self) -> dict[str, Any]:
        return {"type": f"{__name__}.InProcessLane", "lane": self.lane, "replica": self.policy is not None}
