"""In-process sampler on transformers: batched generation from the live policy.

Returns, per sample, the exact token ids the trainer will see (the prompt rendered once by
:func:`~rlvr.backends.model.io.render_prompt_ids`), the behaviour log-prob of each sampled token
under the distribution actually sampled from (after the penalty, temperature and the ``min_p`` /
``top_k`` / ``top_p`` truncations, as vLLM's ``processed_logprobs``), the stop reason, and the
policy version. Every sample has its own seed and every draw is made on the model's device from
that seed and the decode position (:class:`SeededDraw`), so a completion depends on its prompt
and seed alone, whatever shares its batch, and a resumed run samples exactly what an
uninterrupted one did. Only the chosen tokens' log-probs are kept, one ``[B]`` vector a step.

A backend module: imports torch and transformers.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import torch
from transformers import (
    GenerationConfig,
    LogitsProcessor,
    LogitsProcessorList,
    NoBadWordsLogitsProcessor,
    StoppingCriteria,
    StoppingCriteriaList,
)

from rlvr.backends.model.io import cache_kwarg, render_prompt_ids
from rlvr.backends.model.policy import Policy
from rlvr.backends.sample.compiled import bucketed_width, padded_batch, static_cache_options
from rlvr.backends.sample.noise import row_keys, uniforms
from rlvr.backends.sample.prefix import shared_prompt_cache
from rlvr.backends.sample.processing import check_params, draw, greedy, penalise, processed_logprobs, truncate
from rlvr.errors import GenerationAbandoned
from rlvr.seeding import derive_seed
from rlvr.types import Completion, Rollout, SamplingParams, StopReason, Task

# GenerationConfig fields whose processors act under greedy decoding, at values that change nothing.
NEUTRAL_GREEDY = {"repetition_penalty": 1.0, "encoder_repetition_penalty": 1.0, "no_repeat_ngram_size": 0,
                  "encoder_no_repeat_ngram_size": 0, "min_new_tokens": 0,
                  "renormalize_logits": False, "remove_invalid_values": False}


class TransformersSampler:
    """``(tasks, k) -> list[list[Rollout]]`` over a shared :class:`Policy`."""

    def __init__(self, policy: Policy, *, max_new_tokens: int = 16, temperature: float = 1.0,
                 top_p: float = 1.0, top_k: int = 0, min_p: float = 0.0, repetition_penalty: float = 1.0,
                 seed: int = 0, batch_size: int = 512):
        self.params = SamplingParams(max_tokens=max_new_tokens, temperature=temperature, top_p=top_p, top_k=top_k,
                                     min_p=min_p, repetition_penalty=repetition_penalty)
        check_params(self.params)
        self.policy, self.seed, self.batch_size = policy, seed, batch_size
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
        ``(seed, version, the task's content hash, i)``."""
        if seeds is None:
            seeds = [[derive_seed(self.seed, "sample", self.policy.version, t.content_hash, i) for i in range(k)]
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
        outs = sample_batch(policy.model, prompts, self.params, seed=[s for _, s in samples], eos_ids=policy.eos_ids,
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
        p = self.params
        return {"type": "rlvr.backends.sample.batched.TransformersSampler", "max_new_tokens": p.max_tokens,
                "temperature": p.temperature, "top_p": p.top_p, "top_k": p.top_k, "min_p": p.min_p,
                "repetition_penalty": p.repetition_penalty}


class SeededDraw(LogitsProcessor):
    """The draw of every row at once, as the last logits processor of a greedy ``generate``.

    Per step it processes the (already constrained) logits as vLLM does
    (:mod:`~rlvr.backends.sample.processing`), picks each row's token by inverse CDF with the
    row's uniform for this decode position (:mod:`~rlvr.backends.sample.noise`: a function of the
    row's seed and the position only), records the token's log-prob under the processed
    distribution, and returns scores that are 0 at the chosen token and -inf elsewhere, so the
    greedy argmax ``generate`` takes is the draw. Nothing vocabulary-wide is kept between steps
    (the repetition penalty's seen-token mask aside); :meth:`logprobs` stacks the recorded
    ``[B]`` log-probs. ``temperature == 0`` is greedy and records the argmax's log-prob at
    temperature 1, as vLLM does. Modifies the scores it is given in place (``generate`` hands
    each step a fresh float32 copy).
    """

    def __init__(self, params: SamplingParams, seeds: Sequence[int], prompt_width: int,
                 prompt_ids: torch.Tensor, prompt_mask: torch.Tensor):
        check_params(params)
        self.params, self.width = params, prompt_width
        self.keys = row_keys(seeds, prompt_ids.device) if params.temperature > 0 else None
        self._prompt = (prompt_ids, prompt_mask) if params.repetition_penalty != 1.0 else None
        self._seen: torch.Tensor | None = None
        self._last = 0  # the decode position the seen-token mask is up to date with
        self._logprobs: list[torch.Tensor] = []

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        position = input_ids.shape[1] - self.width  # tokens generated so far: the same for every row
        if self._prompt is not None:
            penalise(scores, self._seen_tokens(input_ids, scores.shape[-1], position), self.params.repetition_penalty)
        if self.keys is None:
            chosen, logprob = greedy(scores)
        else:
            chosen, logprob = draw(truncate(scores, self.params), uniforms(self.keys, position))
        self._logprobs.append(logprob)
        return scores.fill_(-math.inf).scatter_(-1, chosen.unsqueeze(-1), 0.0)

    def _seen_tokens(self, input_ids: torch.Tensor, vocab: int, position: int) -> torch.Tensor:
        """``[B, V]`` bool: the tokens of each row's prompt (padding excluded) and completion so far."""
        if self._seen is None:
            ids, mask = self._prompt  # type: ignore[misc]
            # Padding goes to a spare column, dropped after the scatter.
            cols = ids.masked_fill(mask == 0, vocab)
            seen = torch.zeros(ids.shape[0], vocab + 1, dtype=torch.bool, device=ids.device)
            self._seen = seen.scatter_(1, cols, True)[:, :vocab]
        for at in range(self.width + self._last, input_ids.shape[1]):  # the tokens sampled since the last call
            self._seen.scatter_(1, input_ids[:, at:at + 1], True)
        self._last = position
        return self._seen

    def logprobs(self, steps: int) -> torch.Tensor:
        """``[B, steps]`` float32: the recorded log-prob of each row's token at each of the first
        ``steps`` decode positions (``generate`` may run a step past the end and undo it)."""
        return torch.stack(self._logprobs[:steps], dim=1)


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
    the draw, so the recorded log-probs are those of the distribution sampled from."""
    out: list[LogitsProcessor] = []
    if params.allowed_token_ids is not None:
        out.append(AllowedTokens(params.allowed_token_ids))
    if params.bad_words_ids:
        out.append(NoBadWordsLogitsProcessor([list(w) for w in params.bad_words_ids], eos_token_id=sorted(eos_ids)))
    return out


def left_padded(prompts: Sequence[Sequence[int]], pad_id: int, device: torch.device,
                width: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``(ids, attention mask)`` of ``prompts`` left-padded to ``width`` (default: the longest), so
    every row's next token is generated at the same column."""
    width = width or max(map(len, prompts))
    ids = torch.tensor([[pad_id] * (width - len(p)) + list(p) for p in prompts], device=device)
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=device)
    return ids, mask


class Abandoned(StoppingCriteria):
    """Ends a ``generate`` at the next token once ``abandoned()`` is true, so a batch whose callers
    timed out or whose engine closes does not hold the device to its last token (and a process
    leaving does not find its engine thread still inside torch, which aborts the interpreter)."""

    def __init__(self, abandoned: Callable[[], bool]):
        self.abandoned = abandoned

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor, **kwargs: Any) -> torch.Tensor:
        if self.abandoned():
            raise GenerationAbandoned("generation abandoned mid-batch: its callers stopped waiting, or its "
                                      "engine closed")
        return torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)


@torch.no_grad()
def sample_batch(model: Any, prompts: Sequence[Sequence[int]], params: SamplingParams, *,
                 seed: int | Sequence[int], eos_ids: set[int], pad_id: int,
                 share_prompts: bool = False, compiled: bool = False,
                 abandoned: Callable[[], bool] | None = None) -> list[Completion]:
    """One batched ``generate`` over ``prompts``: per prompt, the sampled ids (up to and including
    the first eos or ``params.stop_token_ids`` token), their log-probs under the distribution
    sampled from (:class:`SeededDraw`) and the stop reason. ``params.allowed_token_ids`` and
    ``params.bad_words_ids`` forbid tokens in the sampling and in the recorded log-probs alike.
    ``temperature == 0`` is greedy.
    ``seed`` is one seed per prompt (or one int, from which per-prompt seeds are derived): a prompt's
    completion depends on its own prompt and seed only, not on the others in the batch.
    ``share_prompts`` reads a prompt that several rows repeat once (a group's samples share theirs:
    :mod:`~rlvr.backends.sample.prefix`); the completions are those of reading it per row. The
    in-process engine turns it on (``sampler.share_prompts``; docs/speed.md has the measurement).
    ``compiled`` decodes with a static KV cache and the compiled forward
    (:mod:`~rlvr.backends.sample.compiled`; prompts are then read per row).
    ``abandoned``, read before each new token, ends the call with :class:`GenerationAbandoned` once
    it says no one waits for the batch any more."""
    seeds = [derive_seed(seed, "row", i) for i in range(len(prompts))] if isinstance(seed, int) else list(seed)
    if len(seeds) != len(prompts):
        raise ValueError(f"sample_batch: {len(seeds)} seeds for {len(prompts)} prompts")
    check_params(params)
    device = next(model.parameters()).device
    rows = len(prompts)
    if compiled:  # a few shapes only, so the compiled forward is reused: spare rows repeat the first
        prompts, seeds = padded_batch(prompts, seeds)
    width = bucketed_width(prompts) if compiled else max(map(len, prompts))
    ids, mask = left_padded(prompts, pad_id, device, width)
    stops = set(eos_ids) | set(params.stop_token_ids)  # a stop token ends a completion as eos does
    drawer = SeededDraw(params, seeds, width, ids, mask)
    # Decoding is always "greedy": the drawer has already chosen each token. transformers fills
    # every field left unset from the model folder's generation_config.json, so the processors that
    # act under greedy decoding are set to neutral explicitly: a folder's repetition_penalty would
    # otherwise reshape the distribution behind the drawer's back.
    config = GenerationConfig(max_new_tokens=params.max_tokens, do_sample=False, pad_token_id=pad_id,
                              eos_token_id=sorted(stops), **NEUTRAL_GREEDY,
                              **(static_cache_options(device) if compiled else {}))
    # Eval mode and never restored: the trainer sets train mode itself at each step, and restoring
    # here could race with another thread generating from the same model.
    model.eval()
    cache = shared_prompt_cache(model, ids, mask) if share_prompts and not compiled else None
    sequences = model.generate(input_ids=ids, attention_mask=mask, generation_config=config,
                               logits_processor=LogitsProcessorList([*constraints(params, stops), drawer]),
                               stopping_criteria=StoppingCriteriaList([Abandoned(abandoned)] if abandoned else []),
                               **({cache_kwarg(model): cache} if cache is not None else {}))
    new = sequences[:rows, width:]
    logp = drawer.logprobs(new.shape[1])[:rows]
    out = []
    for row, row_logp in zip(new.tolist(), logp.tolist(), strict=True):
        end = next((i + 1 for i, t in enumerate(row) if t in stops), None)
        n = end if end is not None else len(row)
        out.append(Completion(tuple(row[:n]), tuple(row_logp[:n]),
                              StopReason.STOP if end is not None else StopReason.LENGTH))
    return out


@torch.no_grad()
def processed_token_logprobs(model: torch.nn.Module, prompt: Sequence[int], completion: Sequence[int],
                             params: SamplingParams) -> list[float]:
    """The log-prob of each ``completion`` token under the distribution :func:`sample_batch` would
    have sampled it from (same processing, same seen tokens for the penalty), by one forward pass
    over ``prompt + completion``: what a server's ``processed_logprobs`` must equal for those tokens.
    ``allowed_token_ids`` and ``bad_words_ids`` are not applied here."""
    check_params(params)
    device = next(model.parameters()).device
    ids = torch.tensor([list(prompt) + list(completion)], device=device)
    model.eval()
    logits = model(input_ids=ids).logits[0, len(prompt) - 1:-1].float()  # [N, V]: position t predicts token t
    if params.repetition_penalty != 1.0:
        seen = torch.zeros_like(logits, dtype=torch.bool)
        seen[:, list(prompt)] = True
        for t in range(1, len(completion)):
            seen[t:, completion[t - 1]] = True
        penalise(logits, seen, params.repetition_penalty)
    logp = processed_logprobs(logits, params)
    return logp.gather(-1, ids[0, len(prompt):].unsqueeze(-1)).squeeze(-1).tolist()
