"""RL step time of the demo configuration against its compute floor, in one process and one run.

The floor is what no RL library can avoid for the same work: one batched ``generate`` of the same
prompts (``group_k`` copies each, same ``max_new_tokens`` and temperature) plus one forward and
backward pass over the same packed sequences, written directly against transformers/torch. The
RL step is rlvr's, measured inside a synchronous run of the loop: rollout stream (engine sampling,
reward, advantages) → trainer (loss, clipping, optimizer step).
Prints both medians, their ratio (target ≤ 1.15), and peak RSS.

    python bench/step_time.py [--config examples/addition.toml] [--steps 10] [--threads 2]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch

from rlvr.cli.settings import load_run_config
from rlvr.cli.wiring import make_loop
from rlvr.run.memory import peak_rss_mb


def floor_step(policy, prompts: list[list[int]], max_new_tokens: int, temperature: float) -> float:
    """One batched generate + one forward/backward of the same shapes, plain transformers."""
    model, tok = policy.model, policy.tokenizer
    width = max(map(len, prompts))
    ids = torch.tensor([[tok.pad_token_id] * (width - len(p)) + p for p in prompts])
    mask = (ids != tok.pad_token_id).long()
    t0 = time.perf_counter()
    model.eval()
    with torch.no_grad():
        out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=max_new_tokens, do_sample=True,
                             temperature=temperature, top_k=0, pad_token_id=tok.pad_token_id)
    model.train()
    seq_mask = torch.cat([mask, torch.ones_like(out[:, width:])], dim=1)
    logits = model(input_ids=out, attention_mask=seq_mask).logits[:, :-1]
    logp = torch.log_softmax(logits.float(), -1).gather(-1, out[:, 1:].unsqueeze(-1)).squeeze(-1)
    (-(logp[:, width - 1:]).mean()).backward()
    model.zero_grad(set_to_none=True)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default=str(Path(__file__).resolve().parent.parent / "examples" / "addition.toml"))
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    n = args.steps + 1  # the first step warms caches and allocators for both
    # Synchronous mode: nothing overlaps, so sample wait + train time is the whole RL step.
    cfg = load_run_config(args.config, [f"--model.threads={args.threads}", f"--loop.max_steps={n}",
                                        f"--loop.heldout_every={n}", "--loop.synchronous_training=true"])
    with tempfile.TemporaryDirectory() as tmp:
        loop = make_loop(cfg, Path(tmp) / "run", log=lambda _m: None)
        record = loop.run()
        rl = [m["perf/sample_wait_time"] + m["perf/train_time"] for m in record.metrics][1:]
        by_id = {t.id: t for t in loop.cursor.tasks}
        from rlvr.backends.model.io import render_prompt_ids

        policy, k, floor = loop.trainer.policy, cfg.loop.group_k, []
        for event in record.of_kind("step")[1:]:
            prompts = [render_prompt_ids(policy.tokenizer, by_id[i].messages) for i in event.data["task_ids"]
                       for _ in range(k)]
            floor.append(floor_step(policy, prompts, cfg.sampler.max_new_tokens, cfg.loop.temp))
        width = max(len(p) for p in prompts) + cfg.sampler.max_new_tokens
    rl_s, floor_s = statistics.median(rl), statistics.median(floor)
    print(f"config: {args.config}  threads: {args.threads}  batch: {cfg.loop.tasks_per_step}x{k} "
          f"sequences of up to {width} tokens")
    print(f"rlvr RL step   median {rl_s * 1000:8.1f} ms over {len(rl)} steps (sample wait + train, synchronous)")
    print(f"compute floor  median {floor_s * 1000:8.1f} ms (one generate + one forward/backward)")
    print(f"ratio          {rl_s / floor_s:8.3f}  (target <= 1.15)")
    print(f"peak RSS       {peak_rss_mb():8.0f} MiB")


if __name__ == "__main__":
    main()
