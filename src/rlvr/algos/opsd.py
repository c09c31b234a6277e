"""``opsd``: on-policy self-distillation (SDFT, arXiv 2601.19897): the reverse KL to the policy itself
conditioned on a demonstration from the row.

Same routing as ``opd`` (every sampled token a ``ref_kl`` member, no rl credit), but the reference
is ``algo.model`` (by default ``"policy"``: the run's own sampler, no extra deployment) scoring the
completion after a prompt that also shows the demonstration: the row's answer, or
``info[algo.demo_field]``, inserted into the last user message by ``algo.demo_template``. The
student learns to answer, without the demonstration, the way it would with it. Components: ``ref_kl``.
"""

from __future__ import annotations

import copy
from typing import Any, ClassVar

from rlvr.algos.base import Algorithm, Samples
from rlvr.algos.opd import reference_logprobs, to_ref_kl
from rlvr.errors import RLLoopError
from rlvr.protocols import ChatTokenizer, Scorer
from rlvr.types import Group, Message, Rollout, Task

DEMO_TEMPLATE = ("{prompt}\n\nHere is an example of a correct response:\n{demo}\n\n"
                 "Now write a response of your own in the same form.")


class OPSD(Algorithm):
    name: ClassVar[str] = "opsd"
    components: ClassVar[tuple[str, ...]] = ("ref_kl",)

    def __init__(self, scorer: Scorer, tokenizer: ChatTokenizer, model: Any = "policy",
                 demo_field: str | None = None, demo_template: str = DEMO_TEMPLATE):
        if "{demo}" not in demo_template or "{prompt}" not in demo_template:
            raise ValueError("algo.demo_template must contain {prompt} and {demo}")
        self.scorer, self.tokenizer, self.model = scorer, tokenizer, model
        self.demo_field, self.demo_template = demo_field, demo_template

    def assign(self, task: Task, samples: Samples) -> Group:
        return to_ref_kl(task, samples)

    async def score(self, group: Group) -> Group:
        conditioned = self.tokenizer.render(self.with_demo(group.task))
        plain = tuple(self.tokenizer.render(group.task.messages))

        def prompt_of(r: Rollout) -> list[int]:
            if tuple(r.prompt_ids) != plain:
                raise RLLoopError(f"row {group.task.id!r}: opsd scores a completion after the row's own prompt, but "
                                  "this rollout starts elsewhere (a later segment of a split episode, or a custom "
                                  "rollout function's prompt); opsd needs rollouts that start at the row's prompt")
            return conditioned

        return await reference_logprobs(group, self.scorer, prompt_of)

    def with_demo(self, task: Task) -> list[Message]:
        """The row's messages with the demonstration folded into its last user message."""
        demo = task.info.get(self.demo_field) if self.demo_field else task.answer
        if demo is None:
            where = f"info.{self.demo_field}" if self.demo_field else "answer"
            raise RLLoopError(f"row {task.id!r}: no demonstration for opsd ({where} is missing)")
        messages = copy.deepcopy(list(task.messages))
        users = [i for i, m in enumerate(messages) if m.get("role") == "user"]
        if not users:
            raise RLLoopError(f"row {task.id!r}: opsd puts the demonstration in a user message, and the row has none")
        last = messages[users[-1]]
        last["content"] = self.demo_template.format(prompt=last.get("content", ""), demo=demo)
        return messages

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "model": self.model, "demo_field": self.demo_field,
                "demo_template": self.demo_template}
