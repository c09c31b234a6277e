"""What the end-to-end learning tests read from a run to say that the policy learned.

A short CPU run's held-out gain is a noisy figure: it rests on one sampling stream and on a warm
start that another CPU's kernels end at a different place (the demo's warm start scored 0.244 on
held-out on an AMD EPYC, 0.368 there with ``ATEN_CPU_CAPABILITY=avx2``, 0.292 on an Intel Xeon with
AMX), and from there the run follows another trajectory. A threshold a little under one machine's
gain can fail on another machine's kernels at every try. A learning test asserts two things, each
with a threshold well under the lowest value measured over seeds and CPU kernels (each test says
what was measured):

- :func:`reward_rise`: the training reward of the last quarter of the steps against the first
  quarter, each a mean over thousands of samples: the learning signal with the least noise (a
  step's mean reward has a standard deviation of 0.03 to 0.065 around its quarter's in the runs
  measured, so the rise of a 60- or 100-step run has a standard error of about 0.015).
- :func:`heldout_gain`: what the run is for, on rows it never trained on.

A policy that is not trained keeps its held-out score (gain 0) and its rise within a standard error
or two of 0.
"""

from __future__ import annotations

from collections.abc import Mapping
from statistics import fmean


def reward_rise(pool_scores: Mapping[int, float]) -> float:
    """Mean training reward (``pool_score``) over the last quarter of the steps minus the mean over
    the first quarter (at least one step each)."""
    steps = sorted(pool_scores)
    if len(steps) < 2:
        raise ValueError(f"a rise needs at least two steps, got {steps}")
    quarter = max(1, len(steps) // 4)
    return fmean(pool_scores[s] for s in steps[-quarter:]) - fmean(pool_scores[s] for s in steps[:quarter])


def heldout_gain(heldout_scores: Mapping[int, float]) -> float:
    """Best held-out score minus the step-0 score (so it never falls as a run goes on)."""
    return max(heldout_scores.values()) - heldout_scores[0]
