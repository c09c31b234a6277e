"""In-process sampler on transformers: batched generation from the live policy.

Returns, per sample, the exact token ids the trainer will see (the prompt rendered once by
:func:`~rlvr.backends.model.io.render_prompt_ids`), the behaviour log-prob of each sampled token
(log-softmax of logits / temperature, i.e. of the distribution actually sampled from), the stop
reason, and the policy version. Randomness is seeded from ``(seed, version)``, so a resumed run
samples exactly what an uninterrupted one did. With ``top_p < 1`` the recorded log-probs are those of
the tempered distribution before nucleus truncation.

A backend module: imports torch and transformers.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import torch
from transformers import GenerationConfig

from rlvr.backends.model.io import render_prompt_ids
from rlvr.backends.model.policy import Policy
from rlvr.seeding import derive_seed
from rlvr.types import Completion, Rollout, SamplingParams, StopReason, Task


class TransformersSampler:
    """``(tasks, k) -> list[list[Rollout]]`` over a shared :class:`Policy`."""

    def __init__(self, policy: Policy, *, max_new_tokens: int = 16, temperature: float = 1.0,
                 top_p: float = 1.0, seed: int = 0, batch_size: int = 512):
        if temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {temperature}")
        self.policy, self.max_new_tokens = policy, max_new_tokens
        self.temperature, self.top_p, self.seed, self.batch_size = temperature, top_p, seed, batch_size
        self._prompts: dict[str, list[int]] = {}

    def prompt_ids(self, task: Task) -> list[int]:
        ids = self._prompts.get(task.id)
        if ids is None:
            ids = self._prompts[task.id] = render_prompt_ids(self.policy.tokenizer, task.messages)
        return ids

    def __call__(self, tasks: Sequence[Task], k: int) -> list[list[Rollout]]:
        flat = [task for task in tasks for _ in range(k)]
        out: list[Rollout] = []
        for start in range(0, len(flat), self.batch_size):
            out.extend(self._generate(flat[start:start + self.batch_size], start))
        return [out[i * k:(i + 1) * k] for i in range(len(tasks))]

    def _generate(self, tasks: Sequence[Task], offset: int) -> list[Rollout]:
        policy = self.policy
        prompts = [self.prompt_ids(t) for t in tasks]
        params = SamplingParams(max_tokens=self.max_new_tokens, temperature=self.temperature, top_p=self.top_p)
        seed = derive_seed(self.seed, "sample", policy.version, offset)
        outs = sample_batch(policy.model, prompts, params, seed=seed, eos_ids=policy.eos_ids,
                            pad_id=policy.tokenizer.pad_token_id)
        return [self._rollout(t, p, out) for t, p, out in zip(tasks, prompts, outs, strict=True)]

    def _rollout(self, task: Task, prompt: list[int], out: Completion) -> Rollout:
        text = self.policy.tokenizer.decode(out.ids, skip_special_tokens=True)
        return Rollout(
            task_id=task.id, prompt_ids=tuple(prompt), completion_ids=out.ids, logprobs=out.logprobs, text=text,
            messages=(*task.messages, {"role": "assistant", "content": text}),
            version=self.policy.version, stop_reason=out.stop_reason,
        )

    def describe(self) -> dict[str, Any]:
        return {"type": "rlvr.backends.sample.batched.TransformersSampler", "max_new_tokens": self.max_new_tokens,
                "temperature": self.temperature, "top_p": self.top_p}


_GLOBAL_RNG = threading.Lock()


@torch.no_grad()
def sample_batch(model: torch.nn.Module, prompts: Sequence[Sequence[int]], params: SamplingParams, *,
                 seed: int, eos_ids: set[int], pad_id: int) -> list[Completion]:
    """One batched ``generate`` over ``prompts``: per prompt, the sampled ids (up to and including
    the first eos), their behaviour log-probs and the stop reason. ``temperature == 0`` is greedy.
    The draw is seeded by ``seed`` alone, so the same prompts in the same order sample the same."""
    device = next(model.parameters()).device
    width = max(map(len, prompts))
    # Left padding: every row's next token is generated at the same column.
    ids = torch.tensor([[pad_id] * (width - len(p)) + list(p) for p in prompts], device=device)
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=device)
    greedy = params.temperature == 0
    # A fresh GenerationConfig: a model's own defaults (repetition_penalty, min_p, ...) would
    # reshape the distribution and make the recorded log-probs describe something else.
    config = GenerationConfig(
        max_new_tokens=params.max_tokens, do_sample=not greedy, pad_token_id=pad_id,
        eos_token_id=sorted(eos_ids), return_dict_in_generate=True, output_logits=True,
        **({} if greedy else {"temperature": params.temperature, "top_p": params.top_p, "top_k": 0}),
    )
    # Eval mode and never restored: the trainer sets train mode itself at each step, and restoring
    # here could race with another thread generating from the same model.
    model.eval()
    # generate() draws from torch's global generator: seeding it is only deterministic while no
    # other thread (the engine's worker, a held-out evaluation) seeds or draws from it meanwhile.
    with _GLOBAL_RNG, torch.random.fork_rng(devices=[] if device.type == "cpu" else [device]):
        torch.manual_seed(seed)
        result = model.generate(input_ids=ids, attention_mask=mask, generation_config=config)
    new = result.sequences[:, width:]
    logits = torch.stack(result.logits, dim=1).float()  # [B, N, V], before temperature
    scale = 1.0 if greedy else params.temperature
    logp = torch.log_softmax(logits / scale, dim=-1).gather(-1, new.unsqueeze(-1)).squeeze(-1)
    out = []
    for row, row_logp in zip(new.tolist(), logp.tolist(), strict=True):
        end = next((i + 1 for i, t in enumerate(row) if t in eos_ids), None)
        n = end if end is not None else len(row)
        out.append(Completion(tuple(row[:n]), tuple(row_logp[:n]),
                              StopReason.STOP if end is not None else StopReason.LENGTH))
    return out
