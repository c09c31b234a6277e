"""Rank 0's trainer seam when the other trainer ranks are cluster actors: :class:`WatchedTrainer`.

It wraps the data-parallel trainer (:class:`~rlvr.backends.train.distributed.DistributedTrainer`,
built through ``make`` so its start is watched too) and keeps one rule: a rank the cluster reports
lost stops the run with a :class:`~rlvr.errors.BackendError` that names the rank, its node and its
process, never a bare collective error and never a hang.

- Before each call (train, save, load) the ranks are checked without waiting: a rank that died while
  rank 0 sampled or evaluated stops the run before any collective is entered.
- A call that fails (a collective sees the peer's closed connection, or rank 0's bounded wait runs
  out) is explained by the ranks the cluster reports lost within :data:`LOST_WAIT_S`; a failure with
  no rank lost is re-raised as it is, since it is not about the ranks.
- ``close`` does not talk to a group that lost a rank.

The loop's own error handling then stops the run at its last checkpoint (``rlvr resume`` continues
it, on any number of ranks). A lost rank is not restarted: a new process cannot join a process
group mid-run.

Standard library only: the ranks are anything with ``lost(wait_s) -> [{rank, ip, pid, cause, ...}]``
and ``describe()``, so the rule is tested with fakes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from rlvr.errors import BackendError, RLVRError

LOST_WAIT_S = 15.0  # how long a failed collective waits for the cluster to report which rank died


class Ranks(Protocol):
    def lost(self, wait_s: float) -> list[dict[str, Any]]: ...

    def describe(self) -> list[dict[str, Any]]: ...


def lost_message(lost: list[dict[str, Any]], when: str) -> str:
    """What stopped the run (``when``: "before train step 3", ...): each lost rank with its node and
    process, and why no rank comes back."""
    named = "; ".join(f"trainer rank {r['rank']} (Ray actor on node {r.get('ip')}, pid {r.get('pid')}) {r['cause']}"
                      for r in lost)
    return (f"{named}, {when}. The run stops: a trainer rank is not restarted, because a new process "
            "cannot join the process group mid-run; its last checkpoint is kept")


class WatchedTrainer:
    """The trainer seam on rank 0, watched; see the module docstring."""

    def __init__(self, make: Callable[[], Any], ranks: Ranks, *, lost_wait_s: float = LOST_WAIT_S):
        self.ranks, self.lost_wait_s, self._lost = ranks, lost_wait_s, False
        self.inner = self._watched("the start (each rank builds the policy and takes rank 0's weights)", make)

    @property
    def version(self) -> int:
        return self.inner.version

    @property
    def policy(self) -> Any:
        return self.inner.policy

    def __call__(self, batch: Any) -> dict[str, float]:
        step = getattr(batch, "step", None)
        return self._watched("a train step" if step is None else f"train step {step}", self.inner, batch)

    def save(self, path: str) -> None:
        self._watched(f"a checkpoint save ({path})", self.inner.save, path)

    def load(self, path: str) -> None:
        self._watched(f"a checkpoint load ({path})", self.inner.load, path)

    def close(self) -> None:
        """Stop the other ranks; with a rank lost there is no group left to tell."""
        inner = getattr(self, "inner", None)
        if inner is None or self._lost or self.ranks.lost(0):
            return
        inner.close()

    def describe(self) -> dict[str, Any]:
        return {**self.inner.describe(), "ranks_on": "ray", "rank_actors": self.ranks.describe()}

    def _watched(self, during: str, fn: Callable[..., Any], *args: Any) -> Any:
        lost = self.ranks.lost(0)
        if lost:
            self._lost = True
            raise BackendError(lost_message(lost, f"before {during}"))
        try:
            return fn(*args)
        except RLVRError:
            raise  # the trainer's own verdict (a replica check, non-finite steps): not about a lost rank
        except Exception as exc:
            lost = self.ranks.lost(self.lost_wait_s)
            if not lost:
                raise
            self._lost = True
            raise BackendError(lost_message(lost, f"during {during}")) from exc
