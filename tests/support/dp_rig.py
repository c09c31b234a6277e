"""Builders for data-parallel trainer tests: a batch of synthetic rollouts of uneven lengths, a
trainer on the tiny model, and a group of real rank processes (gloo, loopback, a free port) that run
a script of trainer calls and leave each rank's weights in a folder; and :func:`parity_tolerance`,
how far apart two float32 trainings of the same rollouts may end, derived from the arithmetic they
do (the one place every parity test takes its tolerance from). Needs torch and peft."""

from __future__ import annotations

import json
import math
import os
import random
import socket
import sys
from pathlib import Path
from typing import Any

import torch

from rlvr.testing import batch_of
from rlvr.types import Batch, Rollout

LR = 1e-2
# torch.optim.AdamW's defaults, which the trainer keeps.
BETAS = (0.9, 0.999)
# float32's unit roundoff: a sum or product is exact to within a relative 2^-24.
UNIT_ROUNDOFF = 2.0 ** -24
# How much cancellation a gradient element may have and stay within the tolerance: its terms' sum of
# magnitudes up to 100x the element (two decimal digits cancelled). See parity_tolerance.
CANCELLATION = 100.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def make_batch(n: int = 11, *, seed: int = 0, step: int = 1, poison: int | None = None,
               shared_prompts: bool = True) -> Batch:
    """``n`` rollouts in groups of up to 4 sharing a prompt (or each its own), completions of 1 to 9
    tokens (so a per-rank token mean differs from the global one), some tokens masked out, advantages
    of both signs; rollout ``poison``'s advantage is NaN."""
    rng = random.Random(seed)
    rollouts = []
    for i in range(n):
        if i % 4 == 0 or not shared_prompts:  # a group shares its prompt: the trainer reads it once (shared_prefix.py)
            prompt = tuple(rng.randrange(20, 90) for _ in range(rng.randint(3, 6)))
        length = rng.randint(1, 9)
        completion = tuple(rng.randrange(20, 90) for _ in range(length))
        mask = tuple(0 if j == 1 else 1 for j in range(length))
        rollouts.append(Rollout(task_id=f"t{i // 4}", prompt_ids=prompt, completion_ids=completion,
                                logprobs=tuple(-rng.uniform(1, 4) * m for m in mask), text="",
                                messages=({"role": "user", "content": "x"},), loss_mask=mask))
    advantages = [rng.uniform(-1, 1) for _ in range(n)]
    if poison is not None:
        advantages[poison] = float("nan")
    return batch_of(rollouts, advantages, step)


def make_trainer(base: Path, lora: bool, cls: Any = None, **kwargs: Any) -> Any:
    from rlvr.backends.model.policy import LoraSpec, Policy
    from rlvr.backends.train.trainer import TorchTrainer

    spec = LoraSpec(rank=4, alpha=8.0) if lora else None
    policy = Policy(str(base), lora=spec, need_reference=False, seed=0)
    return (cls or TorchTrainer)(policy, lr=LR, **kwargs)


def one_rank(base: Path, lora: bool, batches: list[Batch], load: Path | None = None, save: Path | None = None,
             **kwargs: Any) -> tuple[Any, list[dict[str, float]]]:
    """The single-process reference: ``batches`` trained in order, loaded from ``load`` first and
    saved to ``save`` after the first batch when given (``shard`` and ``shard_size`` are rank options,
    ignored here)."""
    trainer = make_trainer(base, lora, **{k: v for k, v in kwargs.items() if k not in ("shard", "shard_size")})
    if load is not None:
        trainer.load(str(load))
    metrics = []
    for i, batch in enumerate(batches):
        metrics.append(trainer(batch))
        if save is not None and i == 0:
            trainer.save(str(save))
    return trainer, metrics


def weights(trainer: Any) -> dict[str, torch.Tensor]:
    """The trainable weights, whole (a sharded parameter is all-gathered: every rank must call this)."""
    def whole(p: torch.Tensor) -> torch.Tensor:
        return p.full_tensor() if hasattr(p, "full_tensor") else p

    return {n: whole(p.detach()).clone() for n, p in trainer.policy.model.named_parameters() if p.requires_grad}


def run_rank(rank: int, world: int, port: int, base: Path, lora: bool | tuple[bool, ...],
             script: list[tuple[Any, ...]], out: Path, kwargs: dict[str, Any]) -> None:
    """One rank: join the group, then rank 0 drives ``script`` (``("train", batch)``, ``("save", path)``,
    ``("load", path)``) through the :class:`DistributedTrainer` while the others serve; each rank
    then writes its weights, version, metrics and torch thread count to ``out/rank{rank}.pt``.
    ``kwargs["shard"] = "fsdp"`` makes the ranks :class:`ShardedTrainer`s (with ``tensor_parallel = T``
    :class:`TensorParallelTrainer`s, with ``shard_size = S`` :class:`HybridShardTrainer`s); they also
    leave rank 0's gathered copy and each parameter's local shard (and its size). ``lora`` as a tuple
    runs the script once per mode in the same processes (one start-up), each leaving ``out/rank{rank}-{lora}.pt``."""
    from rlvr.backends.train.distributed import Ranks, start_ranks

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    ranks = start_ranks(Ranks(rank, world, rank, ""), "cpu")
    for mode in lora if isinstance(lora, tuple) else (lora,):
        name = f"rank{rank}-{mode}.pt" if isinstance(lora, tuple) else f"rank{rank}.pt"
        _run_script(rank, ranks, base, mode, script, out / name, kwargs)
    # Leave together, then skip the interpreter's teardown: a rank whose sharded modules still hold
    # gloo work when Python finalizes can abort ("terminate called without an active exception",
    # SIGABRT) after its results were written, failing a test whose ranks all did their part.
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _run_script(rank: int, ranks: Any, base: Path, lora: bool, script: list[tuple[Any, ...]], file: Path,
                kwargs: dict[str, Any]) -> None:
    from rlvr.backends.train.distributed import DistributedTrainer, RankTrainer, serve_rank
    from rlvr.backends.train.sharded import ShardedTrainer

    kwargs = dict(kwargs)
    if "token_export" in kwargs:  # a folder: each rank exports its share into it as itself
        from rlvr.backends.train.token_export import TokenExport

        kwargs["token_export"] = TokenExport(Path(kwargs["token_export"]), run="dp", rank=rank,
                                             world_size=torch.distributed.get_world_size())
    cls = ShardedTrainer if kwargs.pop("shard", "replicate") == "fsdp" else RankTrainer
    if kwargs.get("tensor_parallel", 1) > 1:
        from rlvr.backends.train.tensor_parallel import TensorParallelTrainer

        cls = TensorParallelTrainer
    else:
        kwargs.pop("tensor_parallel", None)
    if kwargs.get("sequence_parallel", 1) > 1:
        from rlvr.backends.train.sequence_parallel import SequenceParallelTrainer

        cls = SequenceParallelTrainer
    else:
        kwargs.pop("sequence_parallel", None)
    if kwargs.get("shard_size") is not None:
        from rlvr.backends.train.hybrid_shard import HybridShardTrainer

        cls = HybridShardTrainer
    else:
        kwargs.pop("shard_size", None)
    metrics = []
    if rank == 0:
        dp = DistributedTrainer(make_trainer(base, lora, cls, **kwargs), ranks)
        for command, arg in script:
            arg = arg.format(lora=lora) if isinstance(arg, str) else arg  # a folder per mode: "ckpt-{lora}"
            result = getattr(dp, "__call__" if command == "train" else command)(arg)
            if command == "train":
                metrics.append(result)
        dp.close()
        trainer = dp.trainer
    else:
        trainer = serve_rank(lambda _: make_trainer(base, lora, cls, **kwargs))
    extra = {}
    if issubclass(cls, ShardedTrainer):  # what the lanes publish from: rank 0's gathered copy (a collective)
        gathered = trainer.gather()
        extra = {"gathered": {k: v.clone() for k, v in gathered.trainable().items()} if rank == 0 else None,
                 "shards": {n: p.to_local().numel() for n, p in trainer.policy.model.named_parameters()},
                 "offloaded": offloaded_to_cpu(trainer.policy.model),
                 "local": {n: p.to_local().detach().clone() for n, p in trainer.policy.model.named_parameters()}}
    if kwargs.get("offload", "none") != "none":
        from rlvr.backends.train.offload import where_state_lives

        extra["where"] = where_state_lives(trainer)
    torch.save({"weights": weights(trainer), "version": trainer.version, "metrics": metrics,
                "threads": torch.get_num_threads(), **extra}, file)


def offloaded_to_cpu(model: Any) -> list[bool]:
    """For each FSDP2-sharded parameter, whether FSDP2 keeps its shard in host memory (its CPU offload policy)."""
    from torch.distributed.fsdp import FSDPModule

    flags = []
    for module in model.modules():
        group = module._get_fsdp_state()._fsdp_param_group if isinstance(module, FSDPModule) else None
        flags += [fp.offload_to_cpu for fp in (group.fsdp_params if group is not None else [])]
    return flags


def spawn_ranks(world: int, base: Path, lora: bool | tuple[bool, ...], script: list[tuple[Any, ...]], out: Path,
                **kwargs: Any) -> Any:
    """Run ``script`` on ``world`` real processes; what each rank left (see :func:`run_rank`): a list by
    rank, or for a tuple of ``lora`` modes a dict of such lists by mode."""
    out.mkdir(parents=True, exist_ok=True)
    torch.multiprocessing.spawn(run_rank, args=(world, free_port(), base, lora, script, out, kwargs), nprocs=world)
    if isinstance(lora, tuple):
        return {mode: [torch.load(out / f"rank{r}-{mode}.pt", weights_only=False) for r in range(world)]
                for mode in lora}
    return [torch.load(out / f"rank{r}.pt", weights_only=False) for r in range(world)]


def max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k] - b[k]).abs().max()) for k in a)


def adam_step_bound(steps: int, betas: tuple[float, float] = BETAS) -> float:
    """The largest |m̂/√v̂| Adam reaches within ``steps`` steps, whatever the gradients: by
    Cauchy-Schwarz over the moments' weights, (1-β1)/(1-β1^t) · √((1-β2^t)/(1-β2)) ·
    √(Σ_k<t (β1²/β2)^k), at most 1.02 for t <= 6 at the defaults. Each weight moves at most about lr
    per step, however large or small its gradient."""
    b1, b2 = betas

    def bound(t: int) -> float:
        weights = sum((b1 * b1 / b2) ** k for k in range(t))
        return (1 - b1) / (1 - b1 ** t) * math.sqrt((1 - b2 ** t) / (1 - b2)) * math.sqrt(weights)

    return max(bound(t) for t in range(1, steps + 1))


def parity_tolerance(base: Path, batches: list[Batch], steps: int, lr: float = LR) -> float:
    """How far (max abs, per weight) two float32 trainings of ``batches`` from ``base`` may end apart
    when they differ only in the order their sums are taken (ranks' shares against one process,
    micro-batches of other shapes, other thread counts, another CPU's kernels): equal in exact
    arithmetic, not in float32.

    - A float32 sum of N terms, in any order, is within γ_N·Σ|terms| of the exact sum, γ_N =
      N·u/(1-N·u) (Higham, *Accuracy and Stability of Numerical Algorithms*, ch. 4), so two orders
      agree within 2·γ_N·κ relative to the sum, κ = Σ|terms|/|Σ terms| its condition. N: a
      weight's gradient sums a minibatch's token positions (at most the batch's), each term
      carrying the forward and backward reductions over the widest layer (hidden, MLP or
      vocabulary), once per layer each way.
    - AdamW moves a weight by lr·m̂/(√v̂+ε): a relative change ρ in an element's gradients moves m̂
      and √v̂ by at most ρ each, the step by at most 2ρ·B (:func:`adam_step_bound`). Over T steps,
      to first order: |Δw| <= 4·lr·T·B·γ_N·κ.
    - κ is unbounded where an element's terms cancel, and Adam's normalisation then makes its
      rounding a sizeable part of a step: the tolerance admits κ <= ``CANCELLATION``.

    Here (width 128, 2 layers, 11 rollouts, 6 steps at lr 1e-2): 9e-4, a tenth of a step. Measured
    apart, on an AMD EPYC under ATEN_CPU_CAPABILITY=avx2/default, MKL_CBWR=COMPATIBLE (other GEMM
    kernels) and ONEDNN_MAX_CPU_ISA=AVX2: two ranks against one process up to 5.3e-5 (4.0e-5 on
    an Intel Xeon with AMX), other micro-batch sizes or thread counts in one process up to 1.1e-4.
    A bug moves weights by a step's size: a dropped micro-batch or a per-share normalisation by
    about 0.1 (tests/backends/test_data_parallel.py checks both against this tolerance), gradients
    averaged over ranks instead of summed by 5e-3 (and the reported grad norm by half)."""
    config = json.loads((Path(base) / "config.json").read_text())
    width = max(config["hidden_size"], config["intermediate_size"], config["vocab_size"])
    positions = max(sum(len(r.prompt_ids) + len(r.completion_ids) for r in b.rollouts) for b in batches)
    terms = positions + 2 * config["num_hidden_layers"] * width
    gamma = terms * UNIT_ROUNDOFF / (1 - terms * UNIT_ROUNDOFF)
    return 4 * lr * steps * adam_step_bound(steps) * gamma * CANCELLATION
