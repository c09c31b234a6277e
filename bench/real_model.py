"""What makes an RL step on a real model fastest on this CPU: dtype, threads and micro-batch.

On the policy of a run config (default ``examples/smollm2.toml``: SmolLM2-135M-Instruct, LoRA r16),
one step's work is timed in its two parts, each against the config's own settings measured in the
same run (ratio 1.00):
- generate: the step's ``tasks_per_step x group_k`` completions of ``max_new_tokens`` at the
  training temperature, in one batch, as the in-process engine runs them;
- forward-backward: the trainer's loss and backward over those sequences, in micro-batches;
- bfloat16 against float32 on a slice of each (8 generations, 2 sequences' forward-backward).
Each float32 row is run once to warm up, then timed as the median of ``--repeats``.

    python bench/real_model.py [--config examples/smollm2.toml] [--repeats 2]
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch

from rlvr.backends.model.policy import LoraSpec, Policy
from rlvr.backends.model.sources import resolve_base
from rlvr.backends.model.tokenizer import HFChatTokenizer
from rlvr.backends.sample.batched import sample_batch
from rlvr.backends.train.trainer import completion_logprobs, pack
from rlvr.cli.settings import load_run_config
from rlvr.cli.wiring import task_tasks
from rlvr.testing import batch_of
from rlvr.types import Rollout, SamplingParams

ROOT = Path(__file__).resolve().parent.parent


def median_time(fn, repeats: int) -> float:
    fn()  # warm-up: allocator, oneDNN primitives
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default=str(ROOT / "examples" / "smollm2.toml"))
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args()
    cfg = load_run_config(args.config)
    base = resolve_base(cfg.model.base).path
    tasks, _ = task_tasks(cfg)
    n = cfg.loop.tasks_per_step
    params = SamplingParams(max_tokens=cfg.sampler.max_new_tokens, temperature=cfg.loop.temp)
    lora = LoraSpec(rank=cfg.loop.lora_rank, alpha=cfg.train.lora_alpha, targets=tuple(cfg.train.lora_targets))

    def policy_in(dtype: str) -> Policy:
        return Policy(base, lora=lora, dtype=dtype, need_reference=False, seed=0)

    def prompts_of(policy: Policy) -> list[list[int]]:
        chat = HFChatTokenizer(policy.tokenizer)
        return [chat.render(t.messages) for t in tasks[:n] for _ in range(cfg.loop.group_k)]

    def generate(policy: Policy, prompts: list[list[int]]):
        return lambda: sample_batch(policy.model, prompts, params, seed=0, eos_ids=policy.eos_ids,
                                    pad_id=policy.tokenizer.pad_token_id)

    def forward_backward(policy: Policy, rollouts: list[Rollout], micro_batch: int):
        credited = batch_of(rollouts, [1.0 if i % 2 else -1.0 for i in range(len(rollouts))]).rollouts

        def step():
            policy.model.train()
            for start in range(0, len(credited), micro_batch):
                batch = pack(credited[start:start + micro_batch], policy.tokenizer.pad_token_id, "cpu")
                logp = completion_logprobs(policy.model, batch, params.temperature)
                (-(logp * batch["advantages"]).sum() / batch["mask"].sum()).backward()
            policy.model.zero_grad(set_to_none=True)
        return step

    own = (cfg.model.dtype, cfg.model.threads or torch.get_num_threads(), cfg.train.micro_batch)
    print(f"{Path(args.config).name}: {n} x {cfg.loop.group_k} completions of <= {params.max_tokens} tokens; "
          f"config: dtype {own[0]}, {own[1]} threads, micro_batch {own[2]}")
    flags = set(Path("/proc/cpuinfo").read_text().split()) if Path("/proc/cpuinfo").exists() else set()
    print("CPU bf16 units:", ", ".join(f for f in ("avx512_bf16", "amx_bf16") if f in flags) or "none")
    torch.set_num_threads(own[1])
    policy = policy_in("float32")
    prompts = prompts_of(policy)
    outs = generate(policy, prompts)()
    rollouts = [Rollout(task_id=str(i), prompt_ids=tuple(p), completion_ids=tuple(o.ids), logprobs=tuple(o.logprobs),
                        text="", messages=())
                for i, (p, o) in enumerate(zip(prompts, outs, strict=True))]
    print(f"sequences: {len(rollouts)}, prompt {min(map(len, prompts))}-{max(map(len, prompts))} tokens, "
          f"completion mean {statistics.mean(len(o.ids) for o in outs):.1f} tokens")
    rows = []
    for threads in sorted({1, own[1]}):
        torch.set_num_threads(threads)
        rows.append(("generate", "float32", threads, "-", median_time(generate(policy, prompts), args.repeats)))
    torch.set_num_threads(own[1])
    for micro in sorted({8, 16, 64, own[2]}):
        rows.append(("forward-backward", "float32", own[1], micro,
                     median_time(forward_backward(policy, rollouts, micro), args.repeats)))
    # bf16 on a slice of the work, against fp32 on the same slice: on a CPU without bf16 units
    # (AVX-512 BF16, AMX) its matmuls fall back to slow paths, and the whole step would take hours.
    probe = [("float32", policy), ("bfloat16", policy_in("bfloat16"))]
    for dtype, model in probe:
        rows.append(("generate, 8 seqs", dtype, own[1], "-", median_time(generate(model, prompts[:8]), 1)))
        rows.append(("fwd-bwd, 2 seqs", dtype, own[1], 2, median_time(forward_backward(model, rollouts[:2], 2), 1)))
    baseline = {part: next(s for p, d, t, m, s in rows if p == part and d == "float32" and t == own[1]
                           and (m in ("-", own[2]) or part.endswith("seqs"))) for part, *_ in rows}
    print(f"{'part':<17} {'dtype':<9} {'threads':>7} {'micro':>5} {'seconds':>8} {'vs fp32, config':>15}")
    for part, dtype, threads, micro, seconds in rows:
        print(f"{part:<17} {dtype:<9} {threads:>7} {micro!s:>5} {seconds:>8.2f} {seconds / baseline[part]:>14.2f}x")


if __name__ == "__main__":
    main()
