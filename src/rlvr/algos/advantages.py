"""Advantage estimators: small pure functions over one group's rewards.

Each takes the rewards ``r_1..r_G`` of one task's completions and returns one scalar advantage per
completion; the algorithm (:mod:`rlvr.algos`) broadcasts it over that completion's trainable tokens.
``ADVANTAGES`` holds the group-relative ones that ``loop.advantage`` names; ``max_rl`` is the
``max_rl`` algorithm's; ``centred`` and ``token_moments`` serve the batch estimators of
:mod:`rlvr.algos.grpo` (REINFORCE++ and its baseline variant).

Shared conventions (μ = group mean, σ = group std):
- Singleton groups (G = 1) have no baseline to compare against, so every estimator returns
  ``[0.0]``: the sample carries no learning signal rather than its raw reward.
- Zero-variance groups (all rewards equal) return exact zeros for every estimator: nothing in the
  group is better than anything else. (GRPO would otherwise divide 0 by ε.)
- Rewards must be finite; the loop rejects NaN/inf before calling these.
Standard library only.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

GRPO_EPS = 1e-6


def _mean(xs: Sequence[float]) -> float:
    return math.fsum(xs) / len(xs)


def _all_equal(xs: Sequence[float]) -> bool:
    return len(xs) < 2 or all(x == xs[0] for x in xs)


def grpo(rewards: Sequence[float], eps: float = GRPO_EPS) -> list[float]:
    """GRPO: ``A_i = (r_i − μ) / (σ + ε)`` with σ the *unbiased* (Bessel, n−1) std and ε = 1e-6.

    This is the convention of verl's ``grpo`` and TRL's default (``torch.std``); TRL's async
    worker uses the population std instead, which scales A by sqrt((G−1)/G).
    """
    if _all_equal(rewards):
        return [0.0] * len(rewards)
    mu = _mean(rewards)
    sigma = math.sqrt(math.fsum((r - mu) ** 2 for r in rewards) / (len(rewards) - 1))
    return [(r - mu) / (sigma + eps) for r in rewards]


def dr_grpo(rewards: Sequence[float]) -> list[float]:
    """Dr.GRPO: ``A_i = r_i − μ`` (mean-centring only; no std, so no difficulty bias)."""
    if _all_equal(rewards):
        return [0.0] * len(rewards)
    mu = _mean(rewards)
    return [r - mu for r in rewards]


def rloo(rewards: Sequence[float]) -> list[float]:
    """RLOO: ``A_i = r_i − mean_{j≠i} r_j = G/(G−1) · (r_i − μ)`` (leave-one-out baseline)."""
    if _all_equal(rewards):
        return [0.0] * len(rewards)
    g = len(rewards)
    total = math.fsum(rewards)
    return [r - (total - r) / (g - 1) for r in rewards]


def max_rl(rewards: Sequence[float]) -> list[float]:
    """MaxRL: ``A_i = (r_i − μ) / μ``, and all zeros when ``μ <= 0`` (no success to learn toward).

    The form of prime-rl's ``max_rl``; the official code also divides by G, a constant a token-mean
    loss absorbs into the learning rate. Meant for rewards in [0, 1]: dividing by the success rate
    weighs rare successes up, which is the k-sum of pass@k gradients MaxRL maximises.
    """
    mu = _mean(rewards)
    if _all_equal(rewards) or mu <= 0:
        return [0.0] * len(rewards)
    return [(r - mu) / mu for r in rewards]


def centred(rewards: Sequence[float]) -> list[float]:
    """``r_i − μ`` (the group mean as baseline); a singleton keeps its raw reward (baseline 0), as
    REINFORCE++-baseline does before whitening over the batch."""
    if len(rewards) < 2:
        return [float(r) for r in rewards]
    mu = _mean(rewards)
    return [r - mu for r in rewards]


def token_moments(values: Sequence[float]) -> tuple[float, float]:
    """Mean and population variance of ``values`` (0, 0 when empty)."""
    if not values:
        return 0.0, 0.0
    mu = _mean(values)
    return mu, math.fsum((v - mu) ** 2 for v in values) / len(values)


ADVANTAGES: dict[str, Callable[[Sequence[float]], list[float]]] = {
    "grpo": grpo,
    "dr_grpo": dr_grpo,
    "rloo": rloo,
}
