"""Rank 0's trainer seam over trainer ranks that are cluster actors, with fake ranks and a fake
trainer (no cluster, no torch): a lost rank stops the run naming the rank, its node and process,
before a collective is entered or after one failed; other failures are left as they are."""

from __future__ import annotations

from typing import Any

import pytest

from rlvr.backends.cluster.rank_watch import WatchedTrainer
from rlvr.errors import BackendError
from rlvr.types import Batch

RANK1 = {"rank": 1, "node_id": "n1", "ip": "10.0.0.2", "pid": 4242}


class FakeRanks:
    """Ranks that report ``lost`` once ``dead`` is set; records how long each look waited."""

    def __init__(self) -> None:
        self.dead: list[dict[str, Any]] = []
        self.waits: list[float] = []

    def lost(self, wait_s: float) -> list[dict[str, Any]]:
        self.waits.append(wait_s)
        return list(self.dead)

    def describe(self) -> list[dict[str, Any]]:
        return [RANK1]


class FakeDistributed:
    """A data-parallel trainer whose calls run ``effect`` (an exception to raise, or a callable)."""

    version = 3
    policy = "the policy"

    def __init__(self) -> None:
        self.effect: Any = None
        self.calls: list[str] = []

    def _run(self, name: str) -> None:
        self.calls.append(name)
        if callable(self.effect):
            self.effect()
        elif self.effect is not None:
            raise self.effect

    def __call__(self, batch: Any) -> dict[str, float]:
        self._run("train")
        return {"loss": 1.0}

    def save(self, path: str) -> None:
        self._run("save")

    def load(self, path: str) -> None:
        self._run("load")

    def close(self) -> None:
        self.calls.append("close")

    def describe(self) -> dict[str, Any]:
        return {"type": "fake", "world_size": 2, "backend": "gloo"}


def make() -> tuple[WatchedTrainer, FakeDistributed, FakeRanks]:
    inner, ranks = FakeDistributed(), FakeRanks()
    return WatchedTrainer(lambda: inner, ranks, lost_wait_s=7.0), inner, ranks


def batch(step: int) -> Batch:
    return Batch(step=step, groups=())


def test_with_every_rank_alive_calls_pass_through_and_the_record_names_the_rank_actors():
    watched, inner, ranks = make()
    assert watched(batch(1)) == {"loss": 1.0}
    watched.save("ckpt")
    watched.load("ckpt")
    watched.close()
    assert inner.calls == ["train", "save", "load", "close"]
    assert watched.version == 3 and watched.policy == "the policy"
    assert watched.describe() == {"type": "fake", "world_size": 2, "backend": "gloo", "ranks_on": "ray",
                                  "rank_actors": [RANK1]}
    assert set(ranks.waits) == {0}  # nothing lost: no call waited on the cluster


def test_a_rank_lost_between_calls_stops_the_next_one_before_any_collective():
    watched, inner, ranks = make()
    ranks.dead = [{**RANK1, "cause": "died (The actor died unexpectedly)"}]
    with pytest.raises(BackendError) as caught:
        watched(batch(5))
    text = str(caught.value)
    assert "trainer rank 1 (Ray actor on node 10.0.0.2, pid 4242) died (The actor died unexpectedly)" in text
    assert "before train step 5" in text and "not restarted" in text and "last checkpoint" in text
    assert inner.calls == []
    watched.close()  # no group left to tell: the stop message is not sent
    assert inner.calls == []


def test_a_failed_collective_is_explained_by_the_rank_the_cluster_reports_lost():
    watched, inner, ranks = make()

    def peer_gone() -> None:
        ranks.dead = [{**RANK1, "cause": "died (SIGKILL)"}]
        raise RuntimeError("Connection closed by peer [127.0.0.1]:1234")

    inner.effect = peer_gone
    said = r"trainer rank 1 .*pid 4242\) died \(SIGKILL\), during a checkpoint save"
    with pytest.raises(BackendError, match=said) as caught:
        watched.save("runs/x/checkpoints/step_2")
    assert isinstance(caught.value.__cause__, RuntimeError)
    assert ranks.waits[-1] == 7.0  # it waited, boundedly, for the cluster to say which rank


def test_a_failure_with_every_rank_alive_is_not_blamed_on_the_ranks():
    watched, inner, ranks = make()
    inner.effect = RuntimeError("out of memory")
    with pytest.raises(RuntimeError, match="out of memory") as caught:
        watched(batch(1))
    assert not isinstance(caught.value, BackendError)
    inner.effect = BackendError("ranks hold different weights")
    with pytest.raises(BackendError, match="different weights"):
        watched.save("ckpt")
    assert ranks.waits[-1] == 0  # the trainer's own verdict: the cluster is not asked to explain it
    inner.effect = None
    watched.close()
    assert inner.calls[-1] == "close"


def test_a_rank_lost_while_the_group_starts_is_named_too():
    ranks = FakeRanks()

    def start() -> Any:
        ranks.dead = [{**RANK1, "cause": "failed (ModuleNotFoundError: No module named 'rlvr')"}]
        raise RuntimeError("Connection closed by peer")

    with pytest.raises(BackendError, match=r"No module named 'rlvr'\), during the start"):
        WatchedTrainer(start, ranks)

