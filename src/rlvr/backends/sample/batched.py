"""In-process sampler on transformers: batched generation from the live policy.

Returns, per sample, the exact token ids the trainer will see (the prompt rendered once by
:func:`~rlvr.backends.model.io.render_prompt_ids`), the behaviour log-prob of each sampled token
(log-softmax of logits / temperature, i.e. of the distribution actually sampled from), the stop
reason, and the policy version. Every sample has its own seed (see :class:`SeededSampling`), so a
completion depends on its prompt and seed alone and a resumed run samples exactly what an
uninterrupted one did. With ``top_p < 1`` the recorded log-probs are those of
the tempered distribution before nucleus truncation.

A backend module: imports torch and transformers.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from transformers import GenerationConfig, LogitsProcessor, LogitsProcessorList, NoBadWordsLogitsProcessor

from rlvr.backends.model.io import render_prompt_ids
from rlvr.backends.model.policy import Policy
from rlvr.backends.sample.prefix import shared_prompt_cache
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

    def __call__(self, tasks: Sequence[Task], k: int, *,
                 seeds: Sequence[Sequence[int]] | None = None) -> list[list[Rollout]]:
        """``k`` rollouts per task. ``seeds[t][i]`` seeds sample ``i`` of task ``t`` (the rollout
        stream passes seeds derived from each row's coordinates); without them a sample is seeded by
        ``(seed, version, task id, i)``."""
        if seeds is None:
            seeds = [[derive_seed(self.seed, "sample", self.policy.version, t.id, i) for i in range(k)]
                     for t in tasks]
        flat = [(task, s) for task, task_seeds in zip(tasks, seeds, strict=True) for s in task_seeds]
        if len(flat) != len(tasks) * k:
            raise ValueError(f"TransformersSampler: seeds must give {k} seeds per task")
        out: list[Rollout] = []
        for start in range(0, len(flat), self.batch_size):
            out.extend(self._generate(flat[start:start + self.batch_size]))
        return [out[i * k:(i + 1) * k] for i in range(len(tasks))]

    def _generate(self, samples: Sequence[tuple[Task, int]]) -> list[Rollout]:
        policy = self.policy
        tasks = [t for t, _ in samples]
        prompts = [self.prompt_ids(t) for t in tasks]
        params = SamplingParams(max_tokens=self.max_new_tokens, temperature=self.temperature, top_p=self.top_p)
        outs = sample_batch(policy.model, prompts, params, seed=[s for _, s in samples], eos_ids=policy.eos_ids,
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


class SeededSampling(LogitsProcessor):
    """Temperature, nucleus and a draw from each row's own generator, applied to greedy decoding.

    ``argmax(logits / T + Gumbel noise)`` is a sample of ``softmax(logits / T)``; drawing each row's
    noise from a generator seeded by that row's seed makes every completion a function of its own
    prompt and seed, whatever else shares its batch (the in-process engine and ``rlvr serve`` batch
    whatever requests arrive together). Nucleus filtering (``top_p < 1``) keeps the smallest set of
    tokens whose probability reaches ``top_p``, at least one, as transformers' top-p does.
    """

    def __init__(self, seeds: Sequence[int], temperature: float, top_p: float):
        self.generators = [torch.Generator().manual_seed(s % (1 << 63)) for s in seeds]
        self.temperature, self.top_p = temperature, top_p

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        scores = scores.float() / self.temperature
        if self.top_p < 1.0:
            ordered, index = scores.sort(dim=-1, descending=False)
            drop = ordered.softmax(dim=-1).cumsum(dim=-1) <= 1.0 - self.top_p
            drop[..., -1] = False  # the most likely token always stays
            scores = scores.masked_fill(drop.scatter(-1, index, drop), float("-inf"))
        vocab = scores.shape[-1]
        uniform = torch.stack([torch.rand(vocab, generator=g) for g in self.generators]).to(scores.device)
        gumbel = -torch.log(-torch.log(uniform.clamp_(min=1e-20)))
        return scores + gumbel


class AllowedTokens(LogitsProcessor):
    """Only ``ids`` may be sampled (vLLM's ``allowed_token_ids``)."""

    def __init__(self, ids: Sequence[int]):
        self.ids = sorted(set(ids))

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        keep = torch.full_like(scores, float("-inf"))
        keep[:, self.ids] = 0.0
        return scores + keep


def constraints(params: SamplingParams, eos_ids: set[int]) -> list[LogitsProcessor]:
    """The processors that forbid tokens (``allowed_token_ids``, ``bad_words_ids``): applied before
    sampling and again to the recorded log-probs, so those stay the distribution sampled from."""
    out: list[LogitsProcessor] = []
    if params.allowed_token_ids is not None:
        out.append(AllowedTokens(params.allowed_token_ids))
    if params.bad_words_ids:
        out.append(NoBadWordsLogitsProcessor([list(w) for w in params.bad_words_ids], eos_token_id=sorted(eos_ids)))
    return out


def _constrained(logits: torch.Tensor, sequences: torch.Tensor, width: int,
                 processors: Sequence[LogitsProcessor]) -> torch.Tensor:
    """``logits`` [B, N, V] as each step's processors saw them: step ``i`` follows ``width + i`` tokens."""
    steps = []
    for i in range(logits.shape[1]):
        scores = logits[:, i]
        for processor in processors:
            scores = processor(sequences[:, :width + i], scores)
        steps.append(scores)
    return torch.stack(steps, dim=1)


@torch.no_grad()
def sample_batch(model: torch.nn.Module, prompts: Sequence[Sequence[int]], params: SamplingParams, *,
                 seed: int | Sequence[int], eos_ids: set[int], pad_id: int,
                 share_prompts: bool = False) -> list[Completion]:
    """One batched ``generate`` over ``prompts``: per prompt, the sampled ids (up to and including
    the first eos or ``params.stop_token_ids`` token), their behaviour log-probs and the stop reason.
    ``params.allowed_token_ids`` and ``params.bad_words_ids`` forbid tokens in the sampling and in
    the recorded log-probs alike. ``temperature == 0`` is greedy.
    ``seed`` is one seed per prompt (or one int, from which per-prompt seeds are derived): a prompt's
    completion depends on its own prompt and seed only, not on the others in the batch.
    ``share_prompts`` reads a prompt that several rows repeat once (a group's samples share theirs:
    :mod:`~rlvr.backends.sample.prefix`); the completions are those of reading it per row. The
    in-process engine turns it on (``sampler.share_prompts``; docs/speed.md has the measurement)."""
    seeds = [derive_seed(seed, "row", i) for i in range(len(prompts))] if isinstance(seed, int) else list(seed)
    if len(seeds) != len(prompts):
        raise ValueError(f"sample_batch: {len(seeds)} seeds for {len(prompts)} prompts")
    device = next(model.parameters()).device
    width = max(map(len, prompts))
    # Left padding: every row's next token is generated at the same column.
    ids = torch.tensor([[pad_id] * (width - len(p)) + list(p) for p in prompts], device=device)
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=device)
    greedy = params.temperature == 0
    stops = set(eos_ids) | set(params.stop_token_ids)  # a stop token ends a completion as eos does
    forbid = constraints(params, stops)
    # A fresh GenerationConfig: a model's own defaults (repetition_penalty, min_p, ...) would
    # reshape the distribution and make the recorded log-probs describe something else. Decoding
    # is always "greedy": sampling is the processor's argmax over Gumbel-perturbed logits.
    config = GenerationConfig(max_new_tokens=params.max_tokens, do_sample=False, pad_token_id=pad_id,
                              eos_token_id=sorted(stops), return_dict_in_generate=True, output_logits=True)
    processors = LogitsProcessorList(forbid + ([] if greedy else [SeededSampling(seeds, params.temperature,
                                                                                 params.top_p)]))
    # Eval mode and never restored: the trainer sets train mode itself at each step, and restoring
    # here could race with another thread generating from the same model.
    model.eval()
    cache = shared_prompt_cache(model, ids, mask) if share_prompts else None
    result = model.generate(input_ids=ids, attention_mask=mask, generation_config=config,
                            logits_processor=processors, **({"past_key_values": cache} if cache is not None else {}))
    new = result.sequences[:, width:]
    logits = torch.stack(result.logits, dim=1).float()  # [B, N, V], before temperature
    if forbid:
        logits = _constrained(logits, result.sequences, width, forbid)
    scale = 1.0 if greedy else params.temperature
    logp = torch.log_softmax(logits / scale, dim=-1).gather(-1, new.unsqueeze(-1)).squeeze(-1)
    out = []
    for row, row_logp in zip(new.tolist(), logp.tolist(), strict=True):
        end = next((i + 1 for i, t in enumerate(row) if t in stops), None)
        n = end if end is not None else len(row)
        out.append(Completion(tuple(row[:n]), tuple(row_logp[:n]),
                              StopReason.STOP if end is not None else StopReason.LENGTH))
    return out
