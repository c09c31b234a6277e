"""Per-token RL losses for language-model policies: pure torch functions.

What it is: policy losses (``POLICY_LOSSES``, or a custom one named by an import spec, see
:mod:`~rlvr.backends.train.losses.custom`), KL estimators (``KL_ESTIMATORS``; k3 clamped as verl's
``low_var_kl``), aggregation modes (each policy loss has a default: ``default_aggregation``),
entropy, truncated IS weights and the trainer's entry point ``compute_loss``, which sums the
``rl``, ``ce`` and ``ref_kl`` components, each normalised over its own tokens.

Invariants: every tensor is [B,T] over completion positions, aligned by the caller; masked-out
positions never reach a loss or a gradient, even when they hold NaN/inf; a NaN at a trained
position yields a non-finite loss rather than being hidden. Imports torch, the standard library
and, to load custom losses, :mod:`rlvr.envs.loading` — never transformers, peft or the rest of rlvr.
"""

from rlvr.backends.train.losses.aggregation import (
    AGGREGATIONS,
    DEFAULT_AGGREGATION,
    aggregate,
    masked_mean,
    zero_outside,
)
from rlvr.backends.train.losses.custom import load_policy_loss
from rlvr.backends.train.losses.divergence import (
    KL_ESTIMATORS,
    entropy_from_logits,
    kl_k1,
    kl_k2,
    kl_k3,
    ref_kl_loss,
    tis_weight,
)
from rlvr.backends.train.losses.objective import (
    LossConfig,
    LossInputs,
    LossOutput,
    compute_loss,
    masked_nll,
)
from rlvr.backends.train.losses.policy import (
    POLICY_LOSSES,
    cispo,
    dapo,
    default_aggregation,
    dppo,
    dro,
    grpo,
    gspo,
    importance_sampling,
    ppo,
    ratio,
    reinforce,
)

__all__ = [
    "AGGREGATIONS",
    "DEFAULT_AGGREGATION",
    "KL_ESTIMATORS",
    "POLICY_LOSSES",
    "LossConfig",
    "LossInputs",
    "LossOutput",
    "aggregate",
    "cispo",
    "compute_loss",
    "dapo",
    "default_aggregation",
    "dppo",
    "dro",
    "entropy_from_logits",
    "grpo",
    "gspo",
    "importance_sampling",
    "kl_k1",
    "kl_k2",
    "kl_k3",
    "load_policy_loss",
    "masked_mean",
    "masked_nll",
    "ppo",
    "ratio",
    "ref_kl_loss",
    "reinforce",
    "tis_weight",
    "zero_outside",
]
