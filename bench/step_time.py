"""rlvr's RL step against its compute floor, on the same shapes, in one process and one run.

rlvr runs the config as ``rlvr train`` would (``make_loop``: whatever its defaults are), made
synchronous so nothing overlaps and sample wait + train + weight sync is the whole step. Every
step's batch is captured as it reaches the trainer; afterwards, for each step, the floor does what
no RL library can avoid for that batch, written directly against transformers/torch on the same
model (LoRA included):

- generate: one batched ``generate`` of the step's prompts (each of the ``group_k`` copies), same
  ``max_new_tokens``, temperature, top-p and stop tokens;
- forward-backward: the step's own sequences (prompt + the completion rlvr sampled), right-padded
  in micro-batches of the trainer's last size (``train.micro_batch``, or what ``"auto"`` chose),
  the output head only on the positions from the shortest prompt on, the completion tokens'
  log-probs, one backward.

The floor is plain transformers: it reads every row's prompt, where rlvr by default reads a prompt
its group repeats once, in generation and in the forward-backward (docs/speed.md), so rlvr's step
can come in under it.

Prints both medians over the steps after the first (which warms caches and allocators), their ratio
(target <= 1.10), the per-phase split of each (rlvr: generate / score / forward-backward / optimizer
/ sync / other, timed as in ``bench/compare_runs.py``), and peak RSS.

    python bench/step_time.py [--config examples/addition.toml] [--steps 10] [--threads N]
    python bench/step_time.py --config examples/smollm2.toml --steps 4
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from phase_timing import PHASES, PhaseClock, format_split
from rlvr.backends.sample import engine as engine_module
from rlvr.config.run import load_run_config
from rlvr.rollouts import stream as stream_module
from rlvr.run.memory import peak_rss_mb
from rlvr.wiring.seams import make_loop


class CapturingTrainer:
    """The run's trainer, keeping each step's rollouts and the phase totals at the end of each call."""

    def __init__(self, inner: Any, phases: PhaseClock):
        self.inner, self.phases, self.batches, self.marks = inner, phases, [], []

    def __call__(self, batch: Any) -> Any:
        self.batches.append(batch.rollouts)
        try:
            return self.inner(batch)
        finally:
            self.marks.append(self.phases.totals())

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def floor_generate(policy: Any, prompts: list[list[int]], cfg: Any) -> float:
    model, pad = policy.model, policy.tokenizer.pad_token_id
    device = next(model.parameters()).device
    width = max(map(len, prompts))
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts], device=device)
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=device)
    start = time.perf_counter()
    model.eval()
    with torch.no_grad():
        out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=cfg.sampler.max_new_tokens,
                             do_sample=True, temperature=cfg.loop.temp, top_p=cfg.sampler.top_p, top_k=0,
                             pad_token_id=pad, eos_token_id=sorted(policy.eos_ids))
        out.tolist()  # on a GPU, the call has returned when the tokens are on the host, as a sampler's must be
    model.train()
    return time.perf_counter() - start


def floor_forward_backward(policy: Any, rollouts: list[Any], micro_batch: int, temperature: float) -> float:
    model, pad = policy.model, policy.tokenizer.pad_token_id
    start = time.perf_counter()
    model.train()
    tokens = sum(len(r.completion_ids) for r in rollouts)
    for lo in range(0, len(rollouts), micro_batch):
        part = rollouts[lo:lo + micro_batch]
        seqs = [list(r.prompt_ids) + list(r.completion_ids) for r in part]
        width = max(map(len, seqs))
        ids = torch.tensor([s + [pad] * (width - len(s)) for s in seqs])
        attn = torch.tensor([[1] * len(s) + [0] * (width - len(s)) for s in seqs])
        skip = min(len(r.prompt_ids) for r in part) - 1  # no completion token is predicted before this
        logits = model(input_ids=ids, attention_mask=attn, logits_to_keep=width - skip).logits[:, :-1]
        logp = torch.log_softmax(logits.float() / temperature, -1).gather(-1, ids[:, skip + 1:, None]).squeeze(-1)
        keep = torch.zeros_like(logp)
        for b, r in enumerate(part):
            first = len(r.prompt_ids) - 1 - skip
            keep[b, first:first + len(r.completion_ids)] = 1.0
        (-(logp * keep).sum() / max(tokens, 1)).backward()
    model.zero_grad(set_to_none=True)
    return time.perf_counter() - start


def rlvr_split(metrics: list[dict[str, float]], marks: list[dict[str, float]]) -> list[dict[str, float]]:
    """Per step: the named phases, from the run record and the phase totals taken after each train call."""
    steps, before = [], {}
    for m, mark in zip(metrics, marks, strict=True):
        delta = {k: mark.get(k, 0.0) - before.get(k, 0.0) for k in ("generate", "score", "optimizer")}
        before = mark
        total = m["perf/sample_wait_time"] + m["perf/train_time"] + m["perf/weight_sync_time"]
        row = {**delta, "forward-backward": m["perf/train_time"] - delta["optimizer"],
               "sync": m["perf/weight_sync_time"], "total": total}
        row["other"] = total - sum(row[p] for p in PHASES[:-1])
        steps.append(row)
    return steps


def medians(rows: list[dict[str, float]]) -> dict[str, float]:
    return {k: statistics.median(r[k] for r in rows) for k in rows[0]}


def synchronous_run(doc: str | None, steps: int, what: str) -> tuple[Any, argparse.Namespace]:
    """The config named by ``--config`` (default: the demo's), run synchronous for ``--steps`` steps plus
    one to warm up, evaluated only at its end, at ``--threads``; and the arguments."""
    ap = argparse.ArgumentParser(description=(doc or "").splitlines()[0])
    ap.add_argument("--config", default=str(Path(__file__).resolve().parent.parent / "examples" / "addition.toml"))
    ap.add_argument("--steps", type=int, default=steps, help=f"{what} (one more runs first, as warm-up)")
    ap.add_argument("--threads", type=int, help="torch threads (default: the config's model.threads)")
    args = ap.parse_args()
    n = args.steps + 1
    overrides = [f"--loop.max_steps={n}", f"--loop.heldout_every={n}", "--loop.synchronous_training=true"]
    return load_run_config(args.config, overrides + ([f"--model.threads={args.threads}"] if args.threads else [])), args


def main() -> None:
    cfg, args = synchronous_run(__doc__, 10, "measured steps")
    phases = PhaseClock()
    with tempfile.TemporaryDirectory(prefix="step_time_") as tmp:
        loop = make_loop(cfg, Path(tmp) / "run", log=lambda m: print("  " + m, flush=True))
        trainer = loop.trainer
        phases.patch(engine_module, "sample_batch", "generate")
        phases.patch(stream_module, "evaluate_rewards_within", "score")
        phases.patch(trainer.optimizer, "step", "optimizer")
        loop.trainer = capture = CapturingTrainer(trainer, phases)
        record = loop.run()
        rl = rlvr_split(record.metrics, capture.marks)[1:]
        policy, floor = trainer.policy, []
        micro = trainer.micro_rows  # what the trainer used last ("auto" sizes it per step)
        for rollouts in capture.batches[1:]:
            gen = floor_generate(policy, [list(r.prompt_ids) for r in rollouts], cfg)
            fb = floor_forward_backward(policy, rollouts, micro, cfg.loop.temp)
            floor.append({"generate": gen, "forward-backward": fb, "total": gen + fb})
        width = max(len(r.prompt_ids) + len(r.completion_ids) for b in capture.batches for r in b)
        completion = statistics.mean(len(r.completion_ids) for b in capture.batches for r in b)
    rl_m, floor_m = medians(rl), medians(floor)
    print(f"config: {args.config}  threads: {cfg.model.threads or torch.get_num_threads()}  dtype: {cfg.model.dtype}  "
          f"batch: {cfg.loop.tasks_per_step}x{cfg.loop.group_k} sequences of up to {width} tokens "
          f"({completion:.1f} completion tokens on average), micro-batch {micro} ({cfg.train.micro_batch}), "
          f"LoRA rank {cfg.loop.lora_rank}")
    print(f"rlvr RL step   median {rl_m['total'] * 1000:9.1f} ms over {len(rl)} steps (sample wait + train + sync, "
          "synchronous)")
    print(f"  per step: {format_split(rl_m)}")
    print(f"compute floor  median {floor_m['total'] * 1000:9.1f} ms (one generate + one forward/backward)")
    print(f"  per step: generate {floor_m['generate'] * 1000:.0f} ms | forward-backward "
          f"{floor_m['forward-backward'] * 1000:.0f} ms")
    print(f"ratio          {rl_m['total'] / floor_m['total']:9.3f}  (target <= 1.10); generate "
          f"{rl_m['generate'] / floor_m['generate']:.3f}, forward-backward + optimizer "
          f"{(rl_m['forward-backward'] + rl_m['optimizer']) / floor_m['forward-backward']:.3f}")
    print(f"peak RSS       {peak_rss_mb():9.0f} MiB")


if __name__ == "__main__":
    main()
