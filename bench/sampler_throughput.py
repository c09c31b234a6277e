"""Generated tokens per second of the in-process engine, `rlvr serve` and vLLM, in one run.

Same model, same prompts (the addition task's, through the model's chat template), same group
shape (``--tasks`` prompts x ``--group`` samples, one seed each), same temperature and
``--max-new-tokens``. Each sampler gets one warm-up round, then ``--rounds`` timed rounds; the
figure is generated tokens / wall seconds of a round (median), and its ratio to the in-process
engine. Servers are started by rlvr on loopback (start-up is not timed) and stopped after.

    python bench/sampler_throughput.py                         # the demo's tiny model, built here
    python bench/sampler_throughput.py --model path/to/folder  # a Hugging Face folder
    python bench/sampler_throughput.py --samplers in_process,vllm --max-new-tokens 64

vLLM comes from `make vllm` (or ``--vllm-python``); without it that row is skipped, saying why.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path

import torch

from rlvr.backends.model.policy import Policy
from rlvr.backends.model.tiny import build_tiny_model
from rlvr.backends.model.tokenizer import HFChatTokenizer
from rlvr.backends.sample.engine import InProcessEngine
from rlvr.backends.sample.http import HTTPGenerator
from rlvr.backends.serve.process import ServerProcess
from rlvr.data.tasks import load_tasks
from rlvr.envs import procedural_task
from rlvr.errors import ConfigError
from rlvr.rollouts.episodes import prompt_ids_of
from rlvr.types import SamplingParams


async def one_round(gen, prompts: list[list[int]], group: int, params: SamplingParams, seed0: int) -> int:
    calls = [gen.generate(p, params, seed=seed0 + i * group + j) for i, p in enumerate(prompts) for j in range(group)]
    return sum(len(c.ids) for c in await asyncio.gather(*calls))


def measure(gen, prompts, group, params, rounds) -> tuple[float, int]:
    """(median tokens/s over timed rounds, tokens per round)."""
    asyncio.run(one_round(gen, prompts, group, params, 0))  # warm-up: allocators, caches, connections
    rates, tokens = [], 0
    for r in range(rounds):
        t0 = time.perf_counter()
        tokens = asyncio.run(one_round(gen, prompts, group, params, 1000 * (r + 1)))
        rates.append(tokens / (time.perf_counter() - t0))
    return statistics.median(rates), tokens


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", help="a Hugging Face model folder (default: the demo's tiny model, built here)")
    ap.add_argument("--samplers", default="in_process,rlvr_serve,vllm")
    ap.add_argument("--tasks", type=int, default=32)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=6)
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2, help="torch threads of the in-process engine and rlvr serve")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--vllm-python", help="interpreter of vLLM's environment (default: as rlvr finds it)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        model = Path(args.model) if args.model else build_tiny_model(Path(tmp) / "tiny", hidden=128, layers=4, heads=4)
        policy = Policy(str(model), lora=None, dtype=args.dtype, need_reference=False)
        tokenizer = HFChatTokenizer(policy.tokenizer)
        rows = procedural_task("addition")[0](args.tasks, seed=0, digits=2)
        prompts = [prompt_ids_of(t, tokenizer) for t in load_tasks(rows)]
        params = SamplingParams(max_tokens=args.max_new_tokens, temperature=args.temperature)
        print(f"model {model.name}: {sum(p.numel() for p in policy.model.parameters()) / 1e6:.1f}M parameters, "
              f"{args.dtype}; {args.tasks} prompts x {args.group} samples, up to {args.max_new_tokens} new tokens, "
              f"temperature {args.temperature}; {args.rounds} timed rounds after one warm-up")
        results: dict[str, float] = {}
        for name in args.samplers.split(","):
            try:
                rate, tokens = run_sampler(name, policy, model, Path(tmp), args, prompts, params)
            except (ConfigError, OSError) as exc:
                print(f"{name:>11}: skipped ({exc})")
                continue
            results[name] = rate
            ratio = f"  x{rate / results['in_process']:.2f} of in_process" if "in_process" in results else ""
            print(f"{name:>11}: {rate:8.1f} tokens/s ({tokens} tokens a round){ratio}")


def run_sampler(name, policy, model, tmp, args, prompts, params) -> tuple[float, int]:
    if name == "in_process":
        engine = InProcessEngine(policy.model, eos_ids=policy.eos_ids, pad_id=policy.tokenizer.pad_token_id)
        try:
            return measure(engine, prompts, args.group, params, args.rounds)
        finally:
            engine.close()
    if name == "rlvr_serve":
        server = ServerProcess(model, threads=args.threads, log_path=tmp / "serve.log")
    elif name == "vllm":
        from rlvr.backends.serve.vllm import VLLMServer, find_vllm_python

        server = VLLMServer(model, python=find_vllm_python(args.vllm_python), dtype=args.dtype, kv_cache_gib=2,
                            log_path=tmp / "vllm.log")
    else:
        raise ConfigError(f"unknown sampler {name!r}; use in_process, rlvr_serve or vllm")
    with server:
        return measure(HTTPGenerator(server.url, server.model_name, timeout_s=600), prompts, args.group, params,
                       args.rounds)


if __name__ == "__main__":
    main()
