"""One decode step's logits turned into the distribution sampled from, and one draw from it.

The processing follows vLLM's sampler step for step, so the log-probs rlvr records in process are
the ones a vLLM started with ``--logprobs-mode processed_logprobs`` reports for the same tokens:

1. float32 logits, with forbidden tokens (``allowed_token_ids``, ``bad_words_ids``) already at -inf;
2. ``repetition_penalty`` on every token seen in the prompt or the completion so far (a positive
   logit divided by it, a negative one multiplied), greedy included;
3. greedy (``temperature == 0``) stops here: the argmax, with its log-prob under ``softmax`` of
   these logits;
4. divided by ``temperature``;
5. ``min_p``: tokens whose probability is below ``min_p`` times the most likely one's are dropped;
6. ``top_k``: tokens scoring below the k-th largest logit are dropped (ties kept);
7. ``top_p``: in ascending order, tokens whose cumulative probability is at most ``1 - top_p``
   are dropped, the most likely always kept;
8. the draw: inverse-CDF sampling with one uniform per row (:mod:`~rlvr.backends.sample.noise`),
   the CDF accumulated in float64 so that no token's chance is distorted by rounding; the recorded
   log-prob is the chosen token's under ``softmax`` of the processed logits.

Invariant: a row's draw depends on its own logits and uniform only; the chosen token always has a
positive probability under the processed distribution.

A backend module: imports torch.
"""

from __future__ import annotations

import math

import torch

from rlvr.types import SamplingParams


def check_params(params: SamplingParams) -> None:
    """Refuse sampling parameters outside vLLM's ranges, naming the field."""
    if not params.temperature >= 0 or not math.isfinite(params.temperature):
        raise ValueError(f"SamplingParams.temperature must be a finite number >= 0, got {params.temperature}")
    if not 0 < params.top_p <= 1:
        raise ValueError(f"SamplingParams.top_p must be in (0, 1], got {params.top_p}")
    if params.top_k < -1 or isinstance(params.top_k, bool) or not isinstance(params.top_k, int):
        raise ValueError(f"SamplingParams.top_k must be an integer: 0 (or -1) for off, else >= 1; got "
                         f"{params.top_k!r}")
    if not 0 <= params.min_p <= 1:
        raise ValueError(f"SamplingParams.min_p must be in [0, 1], got {params.min_p}")
    if not params.repetition_penalty > 0 or not math.isfinite(params.repetition_penalty):
        raise ValueError(f"SamplingParams.repetition_penalty must be a finite number > 0, got "
                         f"{params.repetition_penalty}")


def penalise(scores: torch.Tensor, seen: torch.Tensor, penalty: float) -> torch.Tensor:
    """vLLM's repetition penalty, in place: where ``seen``, a positive logit times ``1 / penalty``,
    any other times ``penalty``."""
    factor = torch.where(scores > 0, 1.0 / penalty, penalty)
    return scores.mul_(torch.where(seen, factor, 1.0))


def truncate(scores: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Steps 4-7 in place on ``scores`` [B, V] (float32, penalised): the processed logits of a sampled step."""
    scores.div_(params.temperature)
    if params.min_p > 0:
        # p_i < min_p * p_max  <=>  x_i < x_max + log(min_p): no softmax needed.
        floor = scores.amax(dim=-1, keepdim=True) + math.log(params.min_p)
        scores.masked_fill_(scores < floor, -math.inf)
    vocab = scores.shape[-1]
    if 0 < params.top_k < vocab:
        kth = scores.topk(params.top_k, dim=-1).values[:, -1:]
        scores.masked_fill_(scores < kth, -math.inf)
    if params.top_p < 1.0:
        ordered, index = scores.sort(dim=-1, descending=False)
        drop = ordered.softmax(dim=-1).cumsum(dim=-1) <= 1.0 - params.top_p
        drop[:, -1] = False  # the most likely token always stays
        scores.masked_fill_(drop.scatter(-1, index, drop), -math.inf)
    return scores


def draw(scores: torch.Tensor, uniform: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per row of processed logits ``scores`` [B, V], the token whose CDF interval holds ``uniform``
    [B] (float64 in [0, 1)), and its log-prob under ``softmax(scores)``: ``([B] int64, [B] float32)``."""
    top, argmax = scores.max(dim=-1, keepdim=True)
    weights = (scores - top).exp_()  # 0 where dropped; the largest is 1
    cdf = weights.cumsum(dim=-1, dtype=torch.float64)
    total = cdf[:, -1:]
    chosen = torch.searchsorted(cdf, uniform.unsqueeze(-1) * total, right=True)
    chosen = chosen.clamp_(max=scores.shape[-1] - 1)
    # u * total rounded up to total (probability about 2**-53): the interval search runs off the end.
    chosen = torch.where(weights.gather(-1, chosen) > 0, chosen, argmax)
    logprob = (scores.gather(-1, chosen) - top).double() - total.log()
    return chosen.squeeze(-1), logprob.squeeze(-1).float()


def greedy(scores: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per row, the argmax of ``scores`` [B, V] and its log-prob under ``softmax(scores)``."""
    top, argmax = scores.max(dim=-1, keepdim=True)
    logprob = top - torch.logsumexp(scores, dim=-1, keepdim=True)
    return argmax.squeeze(-1), logprob.squeeze(-1)


def processed_logprobs(scores: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """``log_softmax`` of the processed distribution, for scores [B, V] already masked and penalised
    (steps 3-7): what the sampler samples from, vocabulary-wide (for scoring given tokens)."""
    if params.temperature == 0:
        return torch.log_softmax(scores, dim=-1)
    return torch.log_softmax(truncate(scores, params), dim=-1)
