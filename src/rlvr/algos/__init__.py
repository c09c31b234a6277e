"""The algorithm family: each named algorithm is a small class that turns a scored group into
per-token credit streams (:mod:`rlvr.algos.base`); the loop and the trainer never branch on which.

=========  =============  ===================================================================
type       components     what it learns from
=========  =============  ===================================================================
grpo       rl             the reward, by ``loop.advantage`` (group-relative or batch estimators)
max_rl     rl             the reward, MaxRL-normalised ``(r − μ)/μ``
reward     rl             the raw reward, no baseline
custom     rl             the user's per-token advantages (or the user's own Algorithm subclass)
opd        ref_kl         reverse KL to a frozen teacher on the policy's samples
opsd       ref_kl         reverse KL to the policy shown a demonstration
sft        ce             NLL of a frozen model's samples
echo       rl + ce        grpo, plus NLL of environment tokens weighted by role (and a user filter)
=========  =============  ===================================================================

Standard library only; a reference model is reached through a :class:`~rlvr.protocols.Scorer`.
"""

from rlvr.algos.base import Algorithm, broadcast
from rlvr.algos.custom import AdvantageInputs, Custom
from rlvr.algos.echo import Echo
from rlvr.algos.grpo import GRPO
from rlvr.algos.max_rl import MaxRL
from rlvr.algos.opd import OPD
from rlvr.algos.opsd import OPSD
from rlvr.algos.reward import RawReward
from rlvr.algos.sft import SFT

ALGORITHMS: dict[str, type[Algorithm]] = {
    cls.name: cls for cls in (GRPO, MaxRL, RawReward, Custom, OPD, OPSD, SFT, Echo)}

__all__ = ["ALGORITHMS", "GRPO", "OPD", "OPSD", "SFT", "AdvantageInputs", "Algorithm", "Custom", "Echo", "MaxRL",
           "RawReward", "broadcast"]
