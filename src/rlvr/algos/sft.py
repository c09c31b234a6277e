"""``sft``: learn (``ce``, masked NLL) from a frozen model's samples: distillation by imitation.

The rows are sampled from ``algo.sampling.source`` (an OpenAI-compatible endpoint, never the policy:
NLL of the policy's own samples only sharpens it), scored by the reward for the record, and every
sampled token is a ``ce`` member at weight 1. No rl credit. Components: ``ce``. Its rows are
frozen-sourced (``samples_from_policy = False``): they carry no policy version and are exempt from
the staleness bound, like offline SFT data.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

from rlvr.algos.base import Algorithm, Samples, nothing, trainable
from rlvr.types import Group, Task


class SFT(Algorithm):
    name: ClassVar[str] = "sft"
    components: ClassVar[tuple[str, ...]] = ("ce",)
    samples_from_policy: ClassVar[bool] = False  # a frozen model's samples: they never age

    def __init__(self, source: dict[str, Any]):
        self.source = dict(source)

    def assign(self, task: Task, samples: Samples) -> Group:
        return Group(task, tuple(dataclasses.replace(r, advantages=None, rl_weights=nothing(r), ce_weights=trainable(r))
                                 for sample in samples for r in sample))

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "sampling_source": self.source}
