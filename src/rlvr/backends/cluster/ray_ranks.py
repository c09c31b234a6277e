"""Trainer ranks 1..N-1 as Ray actors: :class:`RankActor` joins rank 0's process group and serves
trainer commands; :class:`RayRanks` is rank 0's handle on them (placed, recorded, watched, killed).

Ray only places and watches here; the ranks talk through ``torch.distributed`` as under torchrun.
Each actor is given what torchrun would give a rank (``MASTER_ADDR``/``MASTER_PORT`` of rank 0,
``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``), joins with
:func:`~rlvr.backends.train.distributed.start_ranks` (gloo on the CPU with ``cores // N`` torch
threads, NCCL on ``cuda:RANK`` of its node) and then runs ``work``: the serve loop the composition
root hands it (the one torchrun's ranks run), passed as a pickled callable so this module does not
import the CLI.

Invariants: a rank actor is never restarted (``max_restarts = 0``): a new process cannot join a
process group mid-run, so a dead rank ends the run (:mod:`rlvr.backends.cluster.rank_watch` says
which). :meth:`RayRanks.lost` reports every rank whose serve call ended, with its node, process and
cause, without blocking longer than asked.

A backend module: imports ray; torch only inside the actor.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import ray
import ray.exceptions

from rlvr.backends.cluster.ray_rewards import actor_where
from rlvr.errors import BackendError


class RankActor:
    """One trainer rank (made a Ray actor class by :class:`RayRanks`)."""

    def where(self) -> dict[str, Any]:
        return actor_where()

    def serve(self, join: dict[str, Any], work: Callable[[], int]) -> int:
        """Join the group as ``join["rank"]`` and serve rank 0's trainer commands until ``stop``."""
        os.chdir(join["cwd"])  # rank 0's relative paths (run folder, base, checkpoints) mean the same here
        os.environ.update(MASTER_ADDR=join["master_addr"], MASTER_PORT=str(join["master_port"]),
                          RANK=str(join["rank"]), WORLD_SIZE=str(join["world_size"]), LOCAL_RANK=str(join["rank"]))
        if join["device"].startswith("cuda"):
            # Ray hides the GPUs from an actor that reserved none; this rank uses its node's GPU RANK,
            # as a torchrun rank does, so it sees what rank 0 sees.
            if join["visible_devices"] is None:
                os.environ.pop("CUDA_VISIBLE_DEVICES", None)
            else:
                os.environ["CUDA_VISIBLE_DEVICES"] = join["visible_devices"]
        from rlvr.backends.train.distributed import Ranks, start_ranks

        start_ranks(Ranks(join["rank"], join["world_size"], join["rank"], ""), join["device"])
        return int(work())


class RayRanks:
    """Ranks ``1..count`` as actors, each placed with ``options``; see the module docstring."""

    def __init__(self, count: int, *, options: dict[str, Any], startup_timeout_s: float,
                 on_start: Callable[[dict[str, Any]], None]):
        actor_class: Any = ray.remote(RankActor)  # a Ray handle's ``.remote`` methods are untyped
        self.actors = {rank: actor_class.options(max_restarts=0, **options).remote()
                       for rank in range(1, count + 1)}
        self.where: dict[int, dict[str, Any]] = {}
        self._serving: dict[Any, int] = {}
        try:
            for rank, actor in self.actors.items():
                self.where[rank] = ray.get(actor.where.remote(), timeout=startup_timeout_s)
        except ray.exceptions.GetTimeoutError:
            self.kill()
            raise BackendError(f"trainer rank actors were not placed and started within cluster.startup_timeout_s="
                               f"{startup_timeout_s:g}s: the Ray cluster lacks the CPUs asked for "
                               "(cluster.trainer_cpus each)") from None
        except ray.exceptions.RayError as exc:
            self.kill()
            raise BackendError(f"a trainer rank actor failed to start: {_first_line(exc)}") from None
        for rank, where in self.where.items():
            on_start({"role": "trainer", "name": f"trainer rank {rank}", "rank": rank, **where})

    def serve(self, join: dict[str, Any], work: Callable[[], int]) -> None:
        """Start every rank's serve call (each joins the group, so rank 0 joins next)."""
        for rank, actor in self.actors.items():
            self._serving[actor.serve.remote({**join, "rank": rank}, work)] = rank

    def lost(self, wait_s: float) -> list[dict[str, Any]]:
        """Ranks whose serve call ended (the actor died, the loop raised, or it left), waiting at most
        ``wait_s`` for a first one: each with ``rank``, ``node_id``, ``ip``, ``pid`` and ``cause``."""
        refs = list(self._serving)
        if not refs:
            return []
        ray.wait(refs, num_returns=1, timeout=wait_s)
        done, _ = ray.wait(refs, num_returns=len(refs), timeout=0)
        return [{"rank": self._serving[ref], **self.where[self._serving[ref]], "cause": _cause(ref)}
                for ref in sorted(done, key=lambda r: self._serving[r])]

    def describe(self) -> list[dict[str, Any]]:
        return [{"rank": rank, **where} for rank, where in sorted(self.where.items())]

    def kill(self) -> None:
        for actor in self.actors.values():
            try:
                ray.kill(actor, no_restart=True)
            except ray.exceptions.RayError:
                pass  # gone already


def _cause(ref: Any) -> str:
    try:
        code = ray.get(ref, timeout=0)
    except ray.exceptions.RayActorError as exc:
        return f"died ({_first_line(exc)})"
    except ray.exceptions.RayTaskError as exc:
        return f"failed ({_first_line(exc.cause or exc)})"
    except ray.exceptions.RayError as exc:
        return f"was lost ({_first_line(exc)})"
    return f"left the group (its serve loop returned {code})"


def _first_line(exc: BaseException) -> str:
    lines = [line.strip() for line in str(exc).strip().splitlines() if line.strip()]
    return lines[0] if lines else type(exc).__name__
