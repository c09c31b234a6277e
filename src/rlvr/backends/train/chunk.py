"""One micro-batch of a trainer's minibatch, as the torch trainers pass it between their steps.

A minibatch is cut into :class:`Chunk` s of at most ``micro_batch`` rows, each packed
(:func:`~rlvr.backends.train.trainer.pack`) and carrying the minibatch-wide denominators its loss
components are divided by, so the chunks' losses sum to the minibatch's loss exactly. The
old-policy log-probs are filled in before any update (``old_logp``; for the first minibatch under
``update_epochs`` > 1, ``later_old_logp`` until its first pass is done). A sharded rank with fewer
rows than rank 0 runs ``filler`` chunks: they join the collectives and add nothing.

A backend module: imports torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch


@dataclass
class Chunk:
    """A packed micro-batch: ``batch`` (pack's tensors), ``denominators`` (each loss component's
    count over the whole minibatch), ``weight`` (its share of the minibatch's rl units, which
    averages the per-token statistics) and the old-policy log-probs once taken."""

    batch: dict[str, Any]
    denominators: dict[str, float]
    weight: float
    old_logp: torch.Tensor | None = None
    later_old_logp: torch.Tensor | None = None  # the first minibatch's, used from its second pass on
    filler: bool = False

    def keep_old_logp(self, logp: torch.Tensor, first_minibatch: bool) -> None:
        """The old-policy log-probs, taken before any update: the first minibatch trains on-policy on
        its first pass and keeps them for its later passes."""
        if first_minibatch:
            self.later_old_logp = logp
        else:
            self.old_logp = logp

    def after_first_pass(self) -> None:
        """The first minibatch's later passes train against the snapshot kept for them."""
        if self.later_old_logp is not None:
            self.old_logp, self.later_old_logp = self.later_old_logp, None
