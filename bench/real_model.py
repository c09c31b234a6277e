"""Each lever of an RL step on a real model, on and off, in one run: which ones make the step faster.

On the policy of a run config (default ``examples/smollm2.toml``: SmolLM2-135M-Instruct, LoRA r16)
and the step's shapes (``tasks_per_step x group_k`` completions of up to ``max_new_tokens`` at the
training temperature, ``--sequences`` to time a slice), one step's two heavy parts are timed:
- generate, as the in-process engine runs it (one batch): prompts shared by a group read once and
  their KV cache copied, against read per row; bf16 weights against float32; 1 torch thread
  against the config's;
- forward-backward, as the trainer runs it (loss and backward in ``micro_batch`` chunks; the whole
  step in one for ``"auto"``): each repeated prompt read once against every row's read; bf16
  autocast (float32 weights, head and log-softmax) against float32; padding-free packing against
  right padding; the output head in chunks with its own backward against the model run whole (its
  [tokens, vocabulary] logits made, as before the chunked head); gradient checkpointing on;
- the log-prob of the chosen token from the step's completion hidden states, forward and backward:
  the head and log-softmax in chunks with their own backward (``backends/model/head.py``) against
  the head's logits made whole and then ``logit - logsumexp`` in chunks, and a full float32 log-softmax.
Each variant is run once to warm up, then the variants are timed in interleaved rounds (the
machine may be shared: a load change hits on and off alike) and each reports the median of
``--repeats`` rounds and its ratio to the config's own setting. It also prints the log-prob gap
between the sampler and the trainer under each train precision, and the forward passes a step makes.

    python bench/real_model.py [--config examples/smollm2.toml] [--repeats 2] [--sequences 64]
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch

from rlvr.backends.model import precision
from rlvr.backends.model.head import head_logprobs
from rlvr.backends.model.io import chosen_logprobs
from rlvr.backends.model.policy import LoraSpec, Policy
from rlvr.backends.model.sources import resolve_base
from rlvr.backends.model.tokenizer import HFChatTokenizer
from rlvr.backends.sample.batched import sample_batch
from rlvr.backends.train.checkpointing import checkpointing_paused, enable_gradient_checkpointing, is_checkpointed
from rlvr.backends.train.trainer import completion_logprobs, pack
from rlvr.config.run import load_run_config
from rlvr.testing import batch_of
from rlvr.types import Rollout, SamplingParams
from rlvr.wiring.tasks import task_tasks

ROOT = Path(__file__).resolve().parent.parent


def interleaved(variants: dict[str, Callable[[], object]], repeats: int) -> dict[str, float]:
    """Median seconds of each variant over ``repeats`` rounds, each round running every variant once."""
    for fn in variants.values():
        fn()  # warm-up: allocator, oneDNN primitives
    times: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(repeats):
        for name, fn in variants.items():
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(ts) for name, ts in times.items()}


def with_threads(n: int, fn: Callable[[], object]) -> Callable[[], object]:
    def run():
        before = torch.get_num_threads()
        torch.set_num_threads(n)
        try:
            return fn()
        finally:
            torch.set_num_threads(before)
    return run


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default=str(ROOT / "examples" / "smollm2.toml"))
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--sequences", type=int, default=0, help="time a slice of the step (0: the whole step)")
    args = ap.parse_args()
    cfg = load_run_config(args.config)
    threads = cfg.model.threads or torch.get_num_threads()
    torch.set_num_threads(threads)
    tasks, _ = task_tasks(cfg)
    k = cfg.loop.group_k
    n = args.sequences or cfg.loop.tasks_per_step * k
    params = SamplingParams(max_tokens=cfg.sampler.max_new_tokens, temperature=cfg.loop.temp)
    lora = LoraSpec(rank=cfg.loop.lora_rank, alpha=cfg.train.lora_alpha, targets=tuple(cfg.train.lora_targets))
    policy = Policy(resolve_base(cfg.model.base).path, lora=lora, dtype="float32", need_reference=False, seed=0)
    pad = policy.tokenizer.pad_token_id
    chat = HFChatTokenizer(policy.tokenizer)
    prompts = [chat.render(t.messages) for t in tasks[: -(-n // k)] for _ in range(k)][:n]
    bf16_model = copy.deepcopy(policy.model).to(torch.bfloat16)

    def generate(model, share: bool = False):
        return lambda: sample_batch(model, prompts, params, seed=0, eos_ids=policy.eos_ids, pad_id=pad,
                                    share_prompts=share)

    outs = generate(policy.model)()
    rollouts = [Rollout(task_id=str(i), prompt_ids=tuple(p), completion_ids=tuple(o.ids),
                        logprobs=tuple(o.logprobs), text="", messages=())
                for i, (p, o) in enumerate(zip(prompts, outs, strict=True))]
    credited = batch_of(rollouts, [1.0 if i % 2 else -1.0 for i in range(len(rollouts))]).rollouts
    micro = cfg.train.micro_batch if isinstance(cfg.train.micro_batch, int) else n
    batches = [pack(credited[s:s + micro], pad, "cpu") for s in range(0, len(credited), micro)]

    def forward_backward(autocast: str = cfg.train.autocast, packed: bool = cfg.train.packing,
                         shared: bool = cfg.train.share_prompts, whole: bool = False, ckpt: bool = False):
        def step():
            policy.model.train()
            with model_run_whole(whole), checkpointed(policy.model, ckpt):
                for batch in batches:
                    logp = completion_logprobs(policy.model, batch, params.temperature, autocast=autocast,
                                               packed=packed, share_prompts=shared)
                    (-(logp * batch["advantages"]).sum() / batch["mask"].sum()).backward()
            policy.model.zero_grad(set_to_none=True)
        return step

    print(f"{Path(args.config).name}: {n} sequences ({k} per prompt), completions of <= {params.max_tokens} tokens;"
          f" config: {threads} threads, micro_batch {micro}, autocast {cfg.train.autocast}, "
          f"packing {cfg.train.packing}, share_prompts train {cfg.train.share_prompts} / sampler "
          f"{cfg.sampler.share_prompts}")
    flags = set(Path("/proc/cpuinfo").read_text().split()) if Path("/proc/cpuinfo").exists() else set()
    print("CPU bf16 units:", ", ".join(f for f in ("avx512_bf16", "amx_bf16") if f in flags) or "none")
    lens = [len(r.prompt_ids) + len(r.completion_ids) for r in rollouts]
    width = sum(b["ids"].numel() for b in batches)
    print(f"prompt {min(map(len, prompts))}-{max(map(len, prompts))} tokens, completion mean "
          f"{statistics.mean(len(o.ids) for o in outs):.1f}; padded train tokens {width}, real {sum(lens)} "
          f"({1 - sum(lens) / width:.1%} padding)")
    gaps(policy, batches, rollouts, params.temperature, micro, bf16_model, prompts, pad)

    print(f"{'part / variant':<28} {'seconds':>8} {'vs config':>9}", flush=True)
    share = cfg.sampler.share_prompts
    report(interleaved({"generate": generate(policy.model, share),
                        "  shared prompts read once": generate(policy.model, True),
                        "  every row's prompt read": generate(policy.model, False),
                        "  bf16 weights": generate(bf16_model, share),
                        "  1 thread": with_threads(1, generate(policy.model, share))}, args.repeats))
    report(interleaved({"forward-backward": forward_backward(),
                        "  shared prompts read once": forward_backward(shared=True),
                        "  every row's prompt read": forward_backward(shared=False),
                        "  autocast bf16": forward_backward(autocast="bfloat16"),
                        "  autocast none": forward_backward(autocast="none"),
                        "  packing on": forward_backward(packed=True),
                        "  bf16 + prompts once": forward_backward(autocast="bfloat16", packed=False, shared=True),
                        "  logits made whole": forward_backward(whole=True),
                        "  gradient checkpointing": forward_backward(ckpt=True)},
                       args.repeats))
    report(interleaved(logsoftmax_variants(policy, batches, params.temperature), args.repeats))
    print("forward passes per step: 1 per micro-batch (K = 1: no old-log-prob snapshot; kl_coef = 0: no "
          "reference pass; the sampler's log-probs come from generate's own logits)")


def report(table: dict[str, float]) -> None:
    """One part's rows, each against the part's first row (the config's own setting), printed at once."""
    base = next(iter(table.values()))
    for name, seconds in table.items():
        print(f"{name:<28} {seconds:>8.2f} {seconds / base:>8.2f}x", flush=True)


def logsoftmax_variants(policy: Policy, batches, temperature: float) -> dict[str, Callable[[], object]]:
    """The chosen-token log-prob from the step's completion positions' hidden states, forward and backward."""
    head = policy.model.get_output_embeddings()
    H, V = head.weight.shape[1], head.weight.shape[0]
    tokens = sum(int(b["mask"].sum()) for b in batches)
    generator = torch.Generator().manual_seed(0)
    hidden = torch.randn(tokens, H, generator=generator)
    targets = torch.randint(0, V, (tokens,), generator=generator)

    def chunked_head():
        head_logprobs(hidden.clone().requires_grad_(), head, targets, temperature).sum().backward()

    def logits_whole():
        logits = head(hidden.clone().requires_grad_())
        chosen_logprobs(logits.unsqueeze(0), targets.unsqueeze(0), temperature).sum().backward()

    def full():
        logits = head(hidden.clone().requires_grad_())
        torch.log_softmax(logits / temperature, dim=-1).gather(-1, targets.unsqueeze(-1)).sum().backward()

    return {"log-prob of chosen token": chunked_head, "  logits whole, chunked lse": logits_whole,
            "  full float32 log-softmax": full}


@contextlib.contextmanager
def model_run_whole(on: bool):
    """Every forward runs the model whole, its logits made for all scored positions (the layout before
    the chunked head; what a model without a plain body/head split still gets)."""
    real = precision.split_head
    if on:
        precision.split_head = lambda model: None
    try:
        yield
    finally:
        precision.split_head = real


@contextlib.contextmanager
def checkpointed(model, on: bool):
    """Gradient checkpointing on for the duration (turned on once, paused outside)."""
    if not on:
        with checkpointing_paused(model):
            yield
        return
    if not is_checkpointed(model):
        enable_gradient_checkpointing(model)
    yield


def gaps(policy: Policy, batches, rollouts, temperature: float, micro: int, bf16_model, prompts, pad) -> None:
    """Sampler-vs-trainer log-prob gap (max and mean |difference| over completion tokens)."""
    def gap(sampled, packed_batches, autocast: str) -> str:
        diffs = []
        with torch.no_grad():
            for i, batch in enumerate(packed_batches):
                logp = completion_logprobs(policy.model, batch, temperature, autocast=autocast)
                for b, r in enumerate(sampled[i * micro:(i + 1) * micro]):
                    diffs.extend((logp[b, : len(r.logprobs)] - torch.tensor(r.logprobs)).abs().tolist())
        return f"max {max(diffs):.2e}, mean {statistics.mean(diffs):.2e}"
    policy.model.eval()
    print(f"log-prob gap, fp32 sampler vs trainer: fp32 {gap(rollouts, batches, 'none')}; "
          f"autocast bf16 {gap(rollouts, batches, 'bfloat16')}")
    params = SamplingParams(max_tokens=max(len(r.completion_ids) for r in rollouts), temperature=temperature)
    outs = sample_batch(bf16_model, prompts, params, seed=0, eos_ids=policy.eos_ids, pad_id=pad)
    same = sum(tuple(o.ids) == r.completion_ids for o, r in zip(outs, rollouts, strict=True))
    sampled = [Rollout(task_id=r.task_id, prompt_ids=r.prompt_ids, completion_ids=tuple(o.ids),
                       logprobs=tuple(o.logprobs), text="", messages=()) for r, o in zip(rollouts, outs, strict=True)]
    sampled = batch_of(sampled, [0.0] * len(sampled)).rollouts
    packed = [pack(sampled[s:s + micro], pad, "cpu") for s in range(0, len(sampled), micro)]
    print(f"bf16-weight sampler: {same}/{len(rollouts)} completions identical to fp32's (same seeds); "
          f"log-prob gap vs fp32 trainer {gap(sampled, packed, 'none')}")


if __name__ == "__main__":
    main()
