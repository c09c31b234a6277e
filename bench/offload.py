"""The trainer's peak memory with and without CPU offload (``[train] offload``), at the same shapes.

Each variant runs in a fresh process (so no peak carries over), trains the same synthetic batches
with a full fine-tune of a tiny model (where AdamW's state is largest: two float32 numbers per
weight), and prints:

- ``peak RSS``: the process's peak resident memory (``ru_maxrss``) and its rise over the moment the
  trainer was built: host memory, everything torch and Python hold;
- ``state by device``: the bytes of the trainable weights, their gradients and the optimizer state
  (HostAdamW's master copies included), summed per device, as the trainer holds them after its last step;
- ``cuda peak``: ``torch.cuda.max_memory_allocated()`` over the steps, when the policy is on a GPU
  (``--device cuda``): the figure offload exists to lower.

Variants: ``none`` and ``optimizer`` on one process (on ``--device``); ``fsdp`` and ``fsdp+params``
(FSDP2's CPUOffloadPolicy) on 2 gloo ranks on the CPU, rank 0's figures.

What the CPU figures show: on a machine without a GPU the device *is* host memory, so offload
cannot save anything there. ``optimizer`` adds a float32 master copy of the trainable weights (its
peak RSS rises by about that much); ``fsdp+params`` moves nothing (the shards were already in host
memory) and adds FSDP2's copy-in/copy-out bookkeeping. Only a CUDA device shows the saving: the
``cuda peak`` of ``optimizer`` drops by the AdamW moments (8 bytes per trainable weight) and their
update's temporaries, and under ``fsdp+params`` a rank's device holds one layer's gathered weights
at a time instead of its shards of all of them.

    python bench/offload.py [--hidden 256] [--layers 4] [--steps 3] [--device cpu|cuda]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import socket
import tempfile
from pathlib import Path
from typing import Any

import torch

ROWS, PROMPT, COMPLETION = 16, 24, 24


def batches(steps: int) -> list[Any]:
    from rlvr.testing import batch_of
    from rlvr.types import Rollout

    rng = random.Random(0)
    out = []
    for step in range(steps):
        rollouts = []
        for i in range(ROWS):
            prompt = tuple(rng.randrange(20, 90) for _ in range(PROMPT))
            completion = tuple(rng.randrange(20, 90) for _ in range(COMPLETION))
            rollouts.append(Rollout(task_id=f"t{i}", prompt_ids=prompt, completion_ids=completion,
                                    logprobs=tuple(-1.0 for _ in completion), text="",
                                    messages=({"role": "user", "content": "x"},), loss_mask=(1,) * COMPLETION))
        out.append(batch_of(rollouts, [rng.uniform(-1, 1) for _ in range(ROWS)], step + 1))
    return out


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def state_by_device(trainer: Any) -> dict[str, float]:
    """MiB of trainable weights + gradients + optimizer state (and host master copies) per device."""
    tensors: list[torch.Tensor] = []
    for p in trainer.policy.trainable_parameters():
        tensors.append(p.to_local() if hasattr(p, "to_local") else p)
    tensors += [t for s in trainer.optimizer.state.values() for t in s.values() if torch.is_tensor(t)]
    tensors += list(getattr(trainer.optimizer, "master", []))
    mib: dict[str, float] = {}
    for t in tensors:
        local = t.to_local() if hasattr(t, "to_local") else t
        mib[str(local.device)] = mib.get(str(local.device), 0.0) + local.numel() * local.element_size() / 2**20
    return {k: round(v, 2) for k, v in sorted(mib.items())}


def _train(trainer: Any, work: list[Any], device: str) -> dict[str, Any]:
    if device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
    for batch in work:
        trainer(batch)
    out: dict[str, Any] = {"state_mib": state_by_device(getattr(trainer, "trainer", trainer))}
    if device.startswith("cuda"):
        out["cuda_peak_mib"] = round(torch.cuda.max_memory_allocated() / 2**20, 1)
    return out


def _single(base: str, offload: str, steps: int, device: str, out: str) -> None:
    from rlvr.backends.model.policy import Policy
    from rlvr.backends.train.trainer import TorchTrainer

    work = batches(steps)
    policy = Policy(base, lora=None, device=device, need_reference=False, seed=0)
    start = peak_rss_mib()
    trainer = TorchTrainer(policy, lr=1e-4, micro_batch=ROWS, offload=offload)
    result = _train(trainer, work, device)
    Path(out).write_text(json.dumps({**result, "peak_rss_mib": round(peak_rss_mib(), 1),
                                     "rss_rise_mib": round(peak_rss_mib() - start, 1)}))


def _rank(rank: int, world: int, port: int, base: str, offload: str, steps: int, out: str) -> None:
    from rlvr.backends.model.policy import Policy
    from rlvr.backends.train.distributed import DistributedTrainer, Ranks, serve_rank, start_ranks
    from rlvr.backends.train.sharded import ShardedTrainer

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    ranks = start_ranks(Ranks(rank, world, rank, ""), "cpu")
    work = batches(steps)

    def build(_: Any) -> Any:
        return ShardedTrainer(Policy(base, lora=None, need_reference=False, seed=0), lr=1e-4, micro_batch=ROWS,
                              offload=offload, share_prompts=False)

    start = peak_rss_mib()
    if rank == 0:
        dp = DistributedTrainer(build(None), ranks)
        result = _train(dp, work, "cpu")
        dp.close()
        Path(out).write_text(json.dumps({**result, "peak_rss_mib": round(peak_rss_mib(), 1),
                                         "rss_rise_mib": round(peak_rss_mib() - start, 1)}))
    else:
        serve_rank(build)
    torch.distributed.destroy_process_group()
    os._exit(0)


def run_variant(name: str, base: str, steps: int, device: str, folder: Path) -> dict[str, Any]:
    out = folder / f"{name}.json"
    if name.startswith("fsdp"):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        offload = "params" if name == "fsdp+params" else "none"
        torch.multiprocessing.spawn(_rank, args=(2, port, base, offload, steps, str(out)), nprocs=2)
    else:
        ctx = torch.multiprocessing.get_context("spawn")
        proc = ctx.Process(target=_single, args=(base, name, steps, device, str(out)))
        proc.start()
        proc.join()
        if proc.exitcode:
            raise SystemExit(f"variant {name} failed (exit {proc.exitcode})")
    return json.loads(out.read_text())


def main() -> None:
    from rlvr.backends.model.tiny import build_tiny_model

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        base = str(build_tiny_model(Path(tmp) / "base", hidden=args.hidden, layers=args.layers, heads=4, seed=0))
        print(f"tiny model hidden {args.hidden}, {args.layers} layers, full fine-tune; {ROWS} rows x "
              f"{PROMPT}+{COMPLETION} tokens, {args.steps} steps; load average {os.getloadavg()[0]:.1f}")
        for name in ("none", "optimizer", "fsdp", "fsdp+params"):
            where = "2 gloo ranks, rank 0" if name.startswith("fsdp") else f"1 process on {args.device}"
            r = run_variant(name, base, args.steps, args.device, Path(tmp))
            cuda = f", cuda peak {r['cuda_peak_mib']} MiB" if "cuda_peak_mib" in r else ""
            print(f"{name:12s} ({where}): peak RSS {r['peak_rss_mib']} MiB (+{r['rss_rise_mib']} from the "
                  f"trainer's build), state by device {r['state_mib']} MiB{cuda}")
        if not torch.cuda.is_available():
            print("no CUDA device: device memory is host memory here, so these figures show offload's cost, not a "
                  "saving (see the module docstring)")


if __name__ == "__main__":
    main()
