"""Reading a final answer and counting turns: the helpers the multi-turn environments share.

:class:`AnswerCheck` parses the last assistant message (``"boxed"``, ``"plain"`` or ``"tags"``) and
compares it with the gold answer(s) by :class:`~rlvr.envs.graders.exact_match.ExactMatch`'s
normalisation, or delegates to an ``inner`` reward function; :func:`turn_of`, :func:`count_role`,
:func:`check_max_turns` and :func:`answer_of` read the conversation and the per-rollout state.
Standard library only.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from rlvr.envs.graders.exact_match import ExactMatch, gold_answers
from rlvr.envs.parsing import answer_tag, last_assistant_text, last_boxed
from rlvr.reward import evaluate_reward

ANSWER_FORMATS = ("boxed", "plain", "tags")

RewardFn = Callable[[list[dict[str, Any]], Any], Any]


class AnswerCheck:
    """Reads the final answer of a conversation and checks it against the gold answer(s).

    ``components(messages, answer)`` returns the reward components (``correct`` and, without an
    ``inner`` reward, ``parsed``), or ``None`` when ``inner`` says the reward does not apply.
    ``passed(components)`` says whether ``correct`` reached ``pass_threshold``.
    """

    def __init__(self, answer_format: str = "boxed", inner: RewardFn | None = None, *, casefold: bool = True,
                 pass_threshold: float = 1.0, who: str = "retry") -> None:
        if answer_format not in ANSWER_FORMATS:
            raise ValueError(f"{who}: answer_format must be one of {ANSWER_FORMATS}, got {answer_format!r}")
        if inner is not None and not callable(inner) and not callable(getattr(inner, "reward_fn", None)):
            raise ValueError(f"{who}: inner must be a reward function or an object with reward_fn, got {inner!r}")
        if isinstance(pass_threshold, bool) or not isinstance(pass_threshold, (int, float)) \
                or not math.isfinite(pass_threshold):
            raise ValueError(f"{who}: pass_threshold must be a finite number, got {pass_threshold!r}")
        self.answer_format, self.inner, self.who = answer_format, inner, who
        self.pass_threshold = float(pass_threshold)
        self._match = ExactMatch(casefold=casefold)

    def parse(self, text: str) -> str | None:
        """The answer a reply states (before normalisation), or ``None``."""
        if self.answer_format == "boxed":
            return last_boxed(text)
        if self.answer_format == "tags":
            return answer_tag(text)
        stripped = text.strip() if isinstance(text, str) else ""
        return stripped or None

    def components(self, messages: Sequence[Mapping[str, Any]], answer: Any) -> dict[str, float] | None:
        if self.inner is not None:
            result = evaluate_reward(self.inner, [dict(m) for m in messages], answer)
            if result.value is None:
                return None
            return {"correct": result.value, **{f"inner/{k}": v for k, v in result.metrics.items()}}
        golds = [self._match.normalize(g) for g in gold_answers(answer, who=self.who)]
        found = self.parse(last_assistant_text(messages, who=f"{self.who}.reward_fn"))
        if found is None:
            return {"correct": 0.0, "parsed": 0.0}
        return {"correct": float(self._match.normalize(found) in golds), "parsed": 1.0}

    def passed(self, components: Mapping[str, float] | None) -> bool:
        return components is not None and components["correct"] >= self.pass_threshold

    def describe(self) -> dict[str, Any]:
        return {"answer_format": self.answer_format, "casefold": self._match.casefold,
                "inner": None if self.inner is None else _label(self.inner), "pass_threshold": self.pass_threshold}


def _label(fn: Any) -> str:
    return getattr(fn, "__qualname__", None) or type(fn).__qualname__


def count_role(messages: Sequence[Mapping[str, Any]], role: str, *, name: str | None = None) -> int:
    """How many messages have ``role`` (and ``name``, when given)."""
    return sum(1 for m in messages if isinstance(m, Mapping) and m.get("role") == role
               and (name is None or m.get("name") == name))


def check_max_turns(max_turns: Any, who: str) -> int:
    if isinstance(max_turns, bool) or not isinstance(max_turns, int) or max_turns < 1:
        raise ValueError(f"{who}: max_turns must be an integer >= 1, got {max_turns!r}")
    return max_turns


def turn_of(messages: Sequence[Mapping[str, Any]], state: Mapping[str, Any] | None) -> int:
    """``state["turn"]`` (model turns so far) or, without one, the number of assistant messages."""
    turn = state.get("turn") if isinstance(state, Mapping) else None
    return turn if isinstance(turn, int) and not isinstance(turn, bool) else count_role(messages, "assistant")


def answer_of(state: Mapping[str, Any] | None, who: str) -> Any:
    if not isinstance(state, Mapping) or "answer" not in state:
        raise ValueError(f"{who}.interact: state has no 'answer'; the loop passes new_state(answer, info)")
    return state["answer"]
