"""``rlvr train``/``resume`` on several trainer ranks: ``--nproc N`` runs torchrun, and under torchrun
each process finds its role.

``--nproc N`` re-runs the same command under ``python -m torch.distributed.run --nproc-per-node N``
on loopback (a free port on 127.0.0.1), with ``--out`` fixed first so every rank names one folder.
Under torchrun (``WORLD_SIZE`` > 1) each process joins the group (:func:`join`): rank 0 goes on to
the loop, the sampler and the run record, as a single process would; every other rank builds its
policy on the base rank 0 names and serves trainer commands until told to stop (:func:`serve`),
printing nothing. The trainer seam hides the ranks from everything else
(:mod:`rlvr.backends.train.distributed`). ``[train] shard`` picks replicated weights or FSDP2
shards (:mod:`rlvr.wiring.scale.sharding`); a run resumes on any number of ranks, with either.

Imports torch and the backends inside its functions, so ``rlvr --help`` stays light.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any, NoReturn

from rlvr.errors import BackendError, UsageError


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def launch(nproc: int, rlvr_args: list[str]) -> int:
    """Run ``rlvr *rlvr_args`` on ``nproc`` ranks under torchrun; its exit status (a rank's failure
    stops them all, torchrun's rule)."""
    if nproc < 1:
        raise UsageError(f"--nproc {nproc}: give the number of trainer ranks, 1 or more")
    if "WORLD_SIZE" in os.environ:
        raise UsageError("--nproc inside torchrun: torchrun already started the ranks; drop --nproc")
    command = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node", str(nproc),
               "--master-addr", "127.0.0.1", "--master-port", str(_free_port()), "-m", "rlvr.cli", *rlvr_args]
    # Set here rather than left to torchrun (which sets 1 and warns): each rank's share of the cores.
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", str(max(1, _cores() // nproc)))}
    return subprocess.run(command, env=env, check=False).returncode


def join(cfg: Any) -> Any:
    """Under torchrun with more than one rank: join the group (gloo on CPU, NCCL on GPU, by
    ``model.device``) and return this process's :class:`~rlvr.backends.train.distributed.Ranks`;
    ``None`` for a single process."""
    from rlvr.backends.train.distributed import ranks_from_env, start_ranks

    ranks = ranks_from_env()
    return None if ranks is None else start_ranks(ranks, cfg.model.device)


def serve(cfg: Any, run_dir: Path | None = None) -> int:
    """A rank other than 0: its trainer on the base rank 0 names, serving until rank 0 stops it
    (``run_dir``: the run's folder, where its token export writes; a Ray actor has none)."""
    import torch
    import transformers

    from rlvr.backends.train.distributed import RankTrainer, current_ranks, serve_rank
    from rlvr.wiring.trainer import make_policy, make_trainer

    if cfg.model.threads:
        torch.set_num_threads(cfg.model.threads)
    transformers.utils.logging.disable_progress_bar()  # rank 0 speaks for the run
    ranks = current_ranks()

    def build(base: str) -> RankTrainer:
        trainer = make_trainer(cfg, make_policy(cfg, Path(base)), ranks, run_dir=run_dir)
        if not isinstance(trainer, RankTrainer):  # a rank answers rank 0's broadcasts and gathers
            raise BackendError(f"rank {ranks.rank if ranks else '?'}: a rank's trainer must be a RankTrainer, "
                               f"make_trainer gave {type(trainer).__name__}")
        return trainer

    serve_rank(build)
    leave()
    return 0


def serve_then_exit(cfg: Any, run_dir: Path | None = None) -> NoReturn:
    """A torchrun rank other than 0: :func:`serve`, then exit without the interpreter's teardown.
    Finalizing a process whose modules still hold gloo state can abort it ("terminate called without an
    active exception", pytorch#179291) after its work is done, and torchrun would then fail the whole
    run; by now the group is destroyed and this rank has nothing left to write."""
    code = serve(cfg, run_dir)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def leave(loop: Any = None) -> None:
    """Rank 0, after the loop: stop the other ranks, then leave the group (no-op outside one)."""
    import torch.distributed as dist

    close = getattr(getattr(loop, "trainer", None), "close", None)
    if close is not None:
        close()
    if dist.is_initialized():
        dist.destroy_process_group()
