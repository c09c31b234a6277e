"""Exact match after normalisation: the plainest verifier.

``ExactMatch(tags=False)`` compares the whole last assistant message with the answer;
``ExactMatch(tags=True)`` compares only the content of its last ``<answer>...</answer>``.
Both sides go through :func:`rlvr.envs.parsing.normalize` (whitespace, ``$``, thousands
separators, trailing period; casefold by default). ``answer`` may be one gold answer or a
list/tuple/set of them: any match pays.

The reward is a :class:`~rlvr.envs.loading.Score` with components ``correct`` (weight 1) and
``parsed`` (weight 0, a metric): 1 when an answer could be read, 0 when tags are required and
absent (the reward is then 0 too).

Load it with ``load_environment("rlvr.envs.graders.exact_match", tags=True)`` or use
``ExactMatch(...)`` directly. Standard library only.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from numbers import Real
from typing import Any

from rlvr.envs.parsing import answer_tag, last_assistant_text, normalize
from rlvr.errors import DataError
from rlvr.reward import Score

NAME = "exact_match"
WEIGHTS = {"correct": 1.0}


class ExactMatch:
    """Reward 1 when the model's answer equals one of the gold answers after normalisation.

    ``tags``: read the answer from the last ``<tag>...</tag>`` (unparsable without one).
    ``tag``: the tag name (default ``answer``). ``allow_unclosed``: accept a final unclosed tag.
    ``casefold``: compare case-insensitively. ``remove_spaces``: drop all whitespace before
    comparing (else runs of whitespace count as one space).
    """

    name = NAME

    def __init__(self, tags: bool = False, casefold: bool = True, *, tag: str = "answer",
                 allow_unclosed: bool = False, remove_spaces: bool = True) -> None:
        for field, value in (("tags", tags), ("casefold", casefold), ("allow_unclosed", allow_unclosed),
                             ("remove_spaces", remove_spaces)):
            if not isinstance(value, bool):
                raise ValueError(f"ExactMatch: {field} must be true or false, got {value!r}")  # noqa: TRY004
        if not isinstance(tag, str) or not tag.strip() or any(ch in tag for ch in "<>/ "):
            raise ValueError(f"ExactMatch: tag must be a bare tag name such as 'answer', got {tag!r}")
        self.tags, self.casefold, self.tag = tags, casefold, tag
        self.allow_unclosed, self.remove_spaces = allow_unclosed, remove_spaces

    def normalize(self, text: Any) -> str:
        return normalize(text, casefold=self.casefold, remove_spaces=self.remove_spaces)

    def parse(self, reply: str) -> str | None:
        """The answer a reply states, before normalisation; ``None`` when it states none."""
        if self.tags:
            return answer_tag(reply, self.tag, allow_unclosed=self.allow_unclosed)
        return reply

    def reward_fn(self, messages: Sequence[Mapping[str, Any]], answer: Any) -> Score:
        golds = [self.normalize(g) for g in gold_answers(answer, who="ExactMatch")]
        found = self.parse(last_assistant_text(messages, who="ExactMatch.reward_fn"))
        if found is None:
            return Score({"correct": 0.0, "parsed": 0.0}, WEIGHTS)
        correct = self.normalize(found) in golds
        return Score({"correct": float(correct), "parsed": 1.0}, WEIGHTS)

    def describe(self) -> dict[str, Any]:
        return {"type": f"{__name__}.ExactMatch", "tags": self.tags, "tag": self.tag, "casefold": self.casefold,
                "allow_unclosed": self.allow_unclosed, "remove_spaces": self.remove_spaces}


def gold_answers(answer: Any, *, who: str) -> list[str]:
    """The gold answers as strings: one string/number, or a non-empty list/tuple/set of them."""
    items = list(answer) if isinstance(answer, (list, tuple, set, frozenset)) else [answer]
    if not items:
        raise DataError(f"{who}: the answer is an empty {type(answer).__name__}; give at least one gold answer")
    out = []
    for item in items:
        if isinstance(item, str):
            out.append(item)
        elif isinstance(item, Real) and not isinstance(item, bool):
            out.append(str(item))
        else:
            raise DataError(f"{who}: a gold answer must be a string or a number, got {item!r} "
                            f"({type(item).__name__})")
    return out


def load_environment(**kwargs: Any) -> ExactMatch:
    """The factory :func:`rlvr.envs.loading.load_environment` calls with its keyword arguments."""
    return ExactMatch(**kwargs)


reward_fn = ExactMatch().reward_fn
