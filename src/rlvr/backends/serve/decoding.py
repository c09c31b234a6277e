"""One slice of decoding for ``rlvr serve``: a batched ``generate`` that reports every token as it is
sampled and can stop between two decode steps, to be resumed later.

A row is a prompt (the request's prompt plus the tokens it was given in earlier slices), its seed
and ``offset`` (how many tokens it already has). The draw is the in-process sampler's
(:class:`~rlvr.backends.sample.batched.SeededDraw`: the same processing, one uniform per (seed,
decode position)), with the decode position counted from the row's first token, so a completion
cut into slices draws the same uniforms as one generated in one go. A slice with every offset 0
and no stop is exactly :func:`~rlvr.backends.sample.batched.sample_batch` (same padding, cache and
processors). A resumed row's prompt is read again (one prefill), so its floats may differ from an
uninterrupted run's at the last bits.

Each step, :class:`SliceDraw` also keeps the ``top_n`` most likely tokens of the processed
distribution (vLLM's ``top_logprobs`` under ``processed_logprobs``) and :class:`_Rows` hands the
step's token of every live row to ``on_token`` and says which rows are done: a stop token, the
row's own budget, ``cancelled(row)``, or, for every row at once, ``yield_now()`` after
``min_steps`` steps (others are waiting).

A backend module: imports torch and transformers.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from transformers import GenerationConfig, LogitsProcessorList, StoppingCriteria, StoppingCriteriaList

from rlvr.backends.model.io import cache_kwarg
from rlvr.backends.sample.batched import NEUTRAL_GREEDY, SeededDraw, constraints, left_padded
from rlvr.backends.sample.noise import uniforms
from rlvr.backends.sample.prefix import shared_prompt_cache
from rlvr.backends.sample.processing import draw, greedy, penalise, truncate
from rlvr.types import SamplingParams

MAX_TOP_LOGPROBS = 20  # as vLLM's default --max-logprobs
LOGPROB_FLOOR = -9999.0  # what vLLM's OpenAI server writes for -inf (JSON has no infinity)


@dataclass(slots=True)
class Row:
    prompt: tuple[int, ...]  # the request's prompt and every token the row already has
    seed: int
    offset: int  # tokens the row already has (its decode positions start here)
    budget: int  # tokens it may still generate


# (row index, token, its log-prob, the top (token, log-prob) pairs or None, "stop"/"length"/None)
TokenEvent = tuple[int, int, float, list[tuple[int, float]] | None, str | None]


class SliceDraw(SeededDraw):
    """:class:`SeededDraw` with per-row decode offsets and the step's top ``top_n`` log-probs."""

    def __init__(self, params: SamplingParams, rows: Sequence[Row], prompt_width: int, prompt_ids: torch.Tensor,
                 prompt_mask: torch.Tensor, top_n: int):
        super().__init__(params, [r.seed for r in rows], prompt_width, prompt_ids, prompt_mask)
        self.offsets = [r.offset for r in rows]
        self.groups = {o: torch.tensor([i for i, r in enumerate(rows) if r.offset == o], device=prompt_ids.device)
                       for o in set(self.offsets)}
        self.top_n = top_n
        self.last: tuple[torch.Tensor, torch.Tensor, tuple[torch.Tensor, torch.Tensor] | None] | None = None

    def _uniforms(self, position: int) -> torch.Tensor:
        assert self.keys is not None
        if len(self.groups) == 1:
            return uniforms(self.keys, self.offsets[0] + position)
        out = torch.empty(self.keys.shape[1], dtype=torch.float64, device=self.keys.device)
        for offset, at in self.groups.items():
            out[at] = uniforms(self.keys[:, at], offset + position)
        return out

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        position = input_ids.shape[1] - self.width
        if self._prompt is not None:
            penalise(scores, self._seen_tokens(input_ids, scores.shape[-1], position), self.params.repetition_penalty)
        if self.keys is None:  # greedy: log-probs (and the top ones) at temperature 1, as vLLM
            chosen, logprob = greedy(scores)
            processed = scores
        else:
            processed = truncate(scores, self.params)
            chosen, logprob = draw(processed, self._uniforms(position))
        top = None
        if self.top_n:
            values, ids = torch.log_softmax(processed.float(), dim=-1).topk(self.top_n, dim=-1)
            top = (ids, values)
        self._logprobs.append(logprob)
        self.last = (chosen, logprob, top)
        return scores.fill_(-math.inf).scatter_(-1, chosen.unsqueeze(-1), 0.0)


class _Rows(StoppingCriteria):
    """Reports each live row's token of the step and ends rows (or the whole slice)."""

    def __init__(self, drawer: SliceDraw, rows: Sequence[Row], stops: set[int], on_token: Callable[[TokenEvent], None],
                 cancelled: Callable[[int], bool], yield_now: Callable[[], bool], min_steps: int):
        self.drawer, self.rows, self.stops, self.on_token = drawer, rows, stops, on_token
        self.cancelled, self.yield_now, self.min_steps = cancelled, yield_now, min_steps
        self.done = [False] * len(rows)
        self.counts = [0] * len(rows)
        self.steps = 0

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor, **kwargs: object) -> torch.Tensor:
        assert self.drawer.last is not None
        chosen, logprob, top = self.drawer.last
        tokens, lps = chosen.tolist(), logprob.tolist()
        tops = (top[0].tolist(), top[1].tolist()) if top is not None else None
        self.steps += 1
        for i, row in enumerate(self.rows):
            if self.done[i]:
                continue
            self.counts[i] += 1
            reason = "stop" if tokens[i] in self.stops else "length" if self.counts[i] >= row.budget else None
            pairs = [(t, max(v, LOGPROB_FLOOR)) for t, v in zip(tops[0][i], tops[1][i], strict=True)] if tops else None
            self.on_token((i, tokens[i], lps[i], pairs, reason))
            self.done[i] = reason is not None or self.cancelled(i)
        if self.steps >= self.min_steps and self.yield_now():
            self.done = [True] * len(self.rows)
        return torch.tensor(self.done, dtype=torch.bool, device=input_ids.device)


@torch.no_grad()
def decode_slice(model: Any, rows: Sequence[Row], params: SamplingParams, *, eos_ids: set[int],
                 pad_id: int, top_n: int, on_token: Callable[[TokenEvent], None],
                 cancelled: Callable[[int], bool] = lambda i: False, yield_now: Callable[[], bool] = lambda: False,
                 min_steps: int = 1, share_prompts: bool = True) -> list[int]:
    """Decode ``rows`` (one sampling setup, ``params.max_tokens`` ignored: each row has its budget)
    until each is done or the slice yields; returns how many tokens each row got."""
    device = next(model.parameters()).device
    prompts = [r.prompt for r in rows]
    width = max(map(len, prompts))
    ids, mask = left_padded(prompts, pad_id, device, width)
    stops = set(eos_ids) | set(params.stop_token_ids)
    drawer = SliceDraw(params, rows, width, ids, mask, min(top_n, MAX_TOP_LOGPROBS))
    watcher = _Rows(drawer, rows, stops, on_token, cancelled, yield_now, min_steps)
    config = GenerationConfig(max_new_tokens=max(r.budget for r in rows), do_sample=False, pad_token_id=pad_id,
                              eos_token_id=sorted(stops), **NEUTRAL_GREEDY)
    model.eval()
    cache = shared_prompt_cache(model, ids, mask) if share_prompts else None
    model.generate(input_ids=ids, attention_mask=mask, generation_config=config,
                   logits_processor=LogitsProcessorList([*constraints(params, stops), drawer]),
                   stopping_criteria=StoppingCriteriaList([watcher]),
                   **({cache_kwarg(model): cache} if cache is not None else {}))
    return watcher.counts
