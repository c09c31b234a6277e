"""The in-process sampler's overhead on a real model: ``sample_batch`` against plain sampled ``generate``.

On the base model of a run config (default ``examples/smollm2.toml``: SmolLM2-135M-Instruct) and
``--rows`` distinct chat prompts of its task, each variant samples ``--tokens`` new tokens per row
at temperature 1 from the full softmax, every row running the whole budget (no end token), so
the variants do the same forward passes:
- ``generate``: ``model.generate(do_sample=True, top_k=0)``, transformers' own multinomial draw;
- ``sample_batch``: rlvr's, as the engine runs it (per-row seeds, the draw made on the device by
  inverse CDF, the chosen tokens' log-probs recorded step by step);
- ``sample_batch (before)``: the sampler as it was before the draw moved to the device, kept here
  to measure against: Gumbel noise from one CPU generator per row (``torch.rand(vocab)`` per row
  per token) and every step's full-vocabulary logits stacked for the log-probs.
One call warms the model up, then each is timed in ``--repeats`` interleaved rounds (the machine may be
shared: a load change hits every variant alike); medians are printed, and ``ratio X``:
``sample_batch`` over ``generate`` in wall time, and ``cpu ratio`` in the process's CPU time (the
steadier measure when other processes share the cores). Peak memory of one call is measured per variant in a fresh
process: on CUDA the allocator's peak, on a CPU the rise of the process's resident
size over what it held before the call (polled every 2 ms).

    python bench/sampler_overhead.py [--config examples/smollm2.toml] [--rows 64] [--tokens 64] [--repeats 3]
                                     [--threads N]
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import torch
from transformers import GenerationConfig, LogitsProcessor, LogitsProcessorList

from rlvr.backends.model.policy import Policy
from rlvr.backends.model.sources import resolve_base
from rlvr.backends.model.tokenizer import HFChatTokenizer
from rlvr.backends.sample.batched import left_padded, sample_batch
from rlvr.config.run import load_run_config
from rlvr.types import SamplingParams
from rlvr.wiring.tasks import task_tasks

ROOT = Path(__file__).resolve().parent.parent
VARIANTS = ("generate", "sample_batch", "sample_batch (before)")


class _GumbelPerRow(LogitsProcessor):
    """The former draw: ``argmax(logits / T + Gumbel noise)``, the noise from one CPU generator per row."""

    def __init__(self, seeds: Sequence[int], temperature: float):
        self.generators = [torch.Generator().manual_seed(s % (1 << 63)) for s in seeds]
        self.temperature = temperature

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        scores = scores.float() / self.temperature
        vocab = scores.shape[-1]
        uniform = torch.stack([torch.rand(vocab, generator=g) for g in self.generators]).to(scores.device)
        return scores + -torch.log(-torch.log(uniform.clamp_(min=1e-20)))


@torch.no_grad()
def sample_batch_before(model, prompts, params: SamplingParams, seeds: Sequence[int], pad_id: int):
    """The former ``sample_batch`` path (no constraints, no shared prompts): every step's logits kept
    (``output_logits``) and stacked ``[B, N, V]`` for the log-probs after ``generate``."""
    device = next(model.parameters()).device
    ids, mask = left_padded(prompts, pad_id, device)
    config = GenerationConfig(max_new_tokens=params.max_tokens, do_sample=False, pad_token_id=pad_id, eos_token_id=[],
                              return_dict_in_generate=True, output_logits=True)
    model.eval()
    result = model.generate(input_ids=ids, attention_mask=mask, generation_config=config,
                            logits_processor=LogitsProcessorList([_GumbelPerRow(seeds, params.temperature)]))
    new = result.sequences[:, ids.shape[1]:]
    logits = torch.stack(result.logits, dim=1).float()
    logp = torch.log_softmax(logits / params.temperature, dim=-1).gather(-1, new.unsqueeze(-1)).squeeze(-1)
    return new.tolist(), logp.tolist()


def _setup(config: str, rows: int, tokens: int, threads: int) -> tuple[Policy, dict[str, Callable[[], object]]]:
    cfg = load_run_config(config)
    if threads or cfg.model.threads:
        torch.set_num_threads(threads or cfg.model.threads)
    tasks, _ = task_tasks(cfg)
    if len(tasks) < rows:
        raise SystemExit(f"{config}: {len(tasks)} rows, fewer than --rows {rows}")
    policy = Policy(resolve_base(cfg.model.base).path, lora=None, dtype=cfg.model.dtype, device=cfg.model.device,
                    need_reference=False)
    chat = HFChatTokenizer(policy.tokenizer)
    prompts = [chat.render(t.messages) for t in tasks[:rows]]
    pad, model = policy.tokenizer.pad_token_id, policy.model
    params = SamplingParams(max_tokens=tokens, temperature=1.0)
    seeds = list(range(rows))
    plain = GenerationConfig(do_sample=True, temperature=1.0, top_k=0, top_p=1.0, max_new_tokens=tokens,
                             pad_token_id=pad, eos_token_id=[])

    def generate():
        ids, mask = left_padded(prompts, pad, model.device)
        return model.generate(input_ids=ids, attention_mask=mask, generation_config=plain).tolist()

    variants = {
        "generate": generate,
        "sample_batch": lambda: sample_batch(model, prompts, params, seed=seeds, eos_ids=set(), pad_id=pad),
        "sample_batch (before)": lambda: sample_batch_before(model, prompts, params, seeds, pad),
    }
    return policy, variants


def _rss_mb() -> float:
    return int(Path("/proc/self/statm").read_text().split()[1]) * resource.getpagesize() / 2**20


def peak_memory(args: argparse.Namespace) -> None:
    """In a fresh process: one call of ``args.peak``, its peak memory in MB as JSON."""
    policy, variants = _setup(args.config, args.rows, args.tokens, args.threads)
    fn = variants[args.peak]
    device = next(policy.model.parameters()).device
    if device.type == "cuda":
        fn()
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        fn()
        peak = (torch.cuda.max_memory_allocated() - before) / 2**20
    else:  # the resident size polled every 2 ms during the call, against what it was before
        fn()
        before, highest, done = _rss_mb(), [0.0], threading.Event()

        def poll():
            while not done.is_set():
                highest[0] = max(highest[0], _rss_mb())
                time.sleep(0.002)

        watcher = threading.Thread(target=poll, daemon=True)
        watcher.start()
        fn()
        done.set()
        watcher.join()
        peak = max(highest[0], _rss_mb()) - before
    print(json.dumps({"variant": args.peak, "peak_mb": peak, "device": device.type}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default=str(ROOT / "examples" / "smollm2.toml"))
    ap.add_argument("--rows", type=int, default=64)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3, help="timed rounds (0: peak memory only)")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: the config's model.threads)")
    ap.add_argument("--no-memory", action="store_true", help="skip the per-variant peak memory processes")
    ap.add_argument("--peak", choices=VARIANTS, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.peak:
        return peak_memory(args)
    policy, variants = _setup(args.config, args.rows, args.tokens, args.threads)
    print(f"{Path(args.config).name}: {args.rows} rows x {args.tokens} new tokens, temperature 1, full softmax; "
          f"{torch.get_num_threads()} threads, device {next(policy.model.parameters()).device}", flush=True)
    if args.repeats:
        timed(variants, args.repeats)
    if args.no_memory:
        return
    for name in VARIANTS:
        command = [sys.executable, __file__, "--config", args.config, "--rows", str(args.rows), "--tokens",
                   str(args.tokens), "--threads", str(args.threads), "--peak", name]
        out = subprocess.run(command, capture_output=True, text=True, check=True)
        result = json.loads(out.stdout.strip().splitlines()[-1])
        print(f"peak memory of one call, {name:<24} {result['peak_mb']:8.0f} MB ({result['device']})")


def timed(variants: dict[str, Callable[[], object]], repeats: int) -> None:
    """Interleaved rounds of every variant, after one warm-up call: medians and the ratios."""
    variants["generate"]()  # warm-up: allocator, oneDNN primitives (the model's, shared by every variant)
    times: dict[str, list[float]] = {name: [] for name in variants}
    cpu: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(repeats):
        for name, fn in variants.items():
            start, start_cpu = time.perf_counter(), time.process_time()
            fn()
            times[name].append(time.perf_counter() - start)
            cpu[name].append(time.process_time() - start_cpu)
    median = {name: statistics.median(ts) for name, ts in times.items()}
    median_cpu = {name: statistics.median(ts) for name, ts in cpu.items()}
    for name, ts in times.items():
        print(f"{name:<24} median {median[name]:7.2f} s   rounds {', '.join(f'{t:.2f}' for t in ts)}   "
              f"CPU time median {median_cpu[name]:7.2f} s, rounds {', '.join(f'{t:.2f}' for t in cpu[name])}")
    print(f"ratio {median['sample_batch'] / median['generate']:.3f}   (sample_batch / generate, wall time; before: "
          f"{median['sample_batch (before)'] / median['generate']:.3f})")
    # On a shared machine the process's CPU time is the steadier measure of the work each variant does.
    print(f"cpu ratio {median_cpu['sample_batch'] / median_cpu['generate']:.3f}   (before: "
          f"{median_cpu['sample_batch (before)'] / median_cpu['generate']:.3f})")


if __name__ == "__main__":
    main()
