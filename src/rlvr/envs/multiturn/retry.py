"""A multi-turn environment that lets the model try again: wrong answer, a short nudge, retry.

``RetryEnv`` pays the **final** answer (the last assistant message) and, after each model turn,
``interact`` answers ``[{"role": "user", "content": retry_prompt}]`` while the answer is wrong and
turns remain (``state["turn"] < max_turns``), else ``[]`` (the conversation ends).

How the final answer is read is :class:`~rlvr.envs.answers.AnswerCheck`, shared with
:mod:`rlvr.envs.multiturn.tools` and :mod:`rlvr.envs.multiturn.retrieval`. ``answer_format`` is one of

- ``"boxed"`` (the default): the content of the last complete ``\\boxed{...}``; none = unparsed;
- ``"plain"``: the whole last assistant message, stripped (for tiny models that cannot write
  ``\\boxed{}``, e.g. the character-level demo model);
- ``"tags"``: the content of the last ``<answer>...</answer>``.

and the parsed answer is compared with the gold answer(s) by :class:`~rlvr.envs.graders.exact_match.ExactMatch`'s
normalisation (any of a list of golds pays). ``inner`` replaces all of this by another reward
function ``inner(messages, answer) -> float | Score | None``; its value is then the paid
``correct`` component, its components are kept as ``inner/NAME`` metrics, and a ``None`` from it
makes the whole reward ``None``. ``pass_threshold`` is the value at which an answer counts as
right (no retry); with exact match values are 0 or 1.

The reward is a :class:`~rlvr.envs.loading.Score` with ``correct`` (paid, weight 1), ``parsed``
(metric) and ``turns`` (metric: the number of assistant messages in the conversation, few-shot
assistant messages in the prompt included).

Procedural rows for the CPU demo: :func:`make_rows` gives addition rows ``"37+45="`` → ``"82"``
(their own draws, not :mod:`rlvr.envs.tasks.arithmetic`'s), and :func:`terse` builds the matching
environment (plain answers, a short ASCII retry prompt), e.g.::

    env = terse(max_turns=2)
    rows = env.make_rows(1000, seed=0)

Standard library only.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from rlvr.envs.answers import ANSWER_FORMATS, AnswerCheck, answer_of, check_max_turns, count_role, turn_of
from rlvr.envs.tasks.arithmetic import evaluate
from rlvr.reward import Score
from rlvr.seeding import rng_for

__all__ = [
    "ANSWER_FORMATS", "NAME", "TERSE_RETRY_PROMPT", "AnswerCheck", "RetryEnv", "count_role", "load_environment",
    "make_rows", "terse"
]

NAME = "retry"
WEIGHTS = {"correct": 1.0}
DEFAULT_RETRY_PROMPT = "Wrong, try again."
TERSE_RETRY_PROMPT = "again="

RewardFn = Callable[[list[dict[str, Any]], Any], Any]


# -------------------------------------------------------------------------------------- RetryEnv


class RetryEnv:
    """Retry until right or out of turns; pay the final answer.

    ``max_turns``: model turns at most (1 = single turn). ``retry_prompt``: the user message sent
    after a wrong answer. ``inner``: a reward function replacing exact match (see module doc).
    ``answer_format``: ``"boxed"``, ``"plain"`` or ``"tags"``. ``casefold``: exact match ignores case.
    ``pass_threshold``: the ``correct`` value that counts as right.
    """

    name = NAME

    def __init__(self, max_turns: int = 3, retry_prompt: str = DEFAULT_RETRY_PROMPT, inner: RewardFn | None = None,
                 *, answer_format: str = "boxed", casefold: bool = True, pass_threshold: float = 1.0) -> None:
        self.max_turns = check_max_turns(max_turns, "RetryEnv")
        if not isinstance(retry_prompt, str) or not retry_prompt.strip():
            raise ValueError(f"RetryEnv: retry_prompt must be a non-empty string, got {retry_prompt!r}")
        self.retry_prompt = retry_prompt
        self.check = AnswerCheck(answer_format, inner, casefold=casefold, pass_threshold=pass_threshold,
                                 who="RetryEnv")

    def reward_fn(self, messages: Sequence[Mapping[str, Any]], answer: Any) -> Score | None:
        components = self.check.components(messages, answer)
        if components is None:
            return None
        return Score({**components, "turns": float(count_role(messages, "assistant"))}, WEIGHTS)

    def interact(self, messages: list[dict[str, Any]], state: dict[str, Any]) -> list[dict[str, Any]]:
        if turn_of(messages, state) >= self.max_turns:
            return []
        components = self.check.components(messages, answer_of(state, "RetryEnv"))
        if components is None or self.check.passed(components):
            return []
        return [{"role": "user", "content": self.retry_prompt}]

    def make_rows(self, n: int, *, seed: int, **options: Any) -> list[dict[str, Any]]:
        """Procedural addition rows (:func:`make_rows`)."""
        return make_rows(n, seed=seed, **options)

    def describe(self) -> dict[str, Any]:
        return {"type": f"{__name__}.RetryEnv", "max_turns": self.max_turns, "retry_prompt": self.retry_prompt,
                **self.check.describe()}


def terse(max_turns: int = 2, retry_prompt: str = TERSE_RETRY_PROMPT, **kwargs: Any) -> RetryEnv:
    """The variant for the tiny character-level model: plain answers, a short ASCII retry prompt."""
    kwargs.setdefault("answer_format", "plain")
    return RetryEnv(max_turns, retry_prompt, **kwargs)


def load_environment(**kwargs: Any) -> RetryEnv:
    """The factory :func:`rlvr.envs.loading.load_environment` calls with its keyword arguments."""
    return RetryEnv(**kwargs)


# ------------------------------------------------------------------------------- procedural rows


def make_rows(n: int, *, seed: int, digits: int = 2, ops: Sequence[str] = ("+",)) -> list[dict[str, Any]]:
    """``n`` rows ``{"prompt": "37+45=", "answer": "82", "info": {...}}``, a pure function of
    ``(seed, index, options)`` (so a shorter draw is a prefix of a longer one).

    ``digits``: digits per operand. ``ops``: operators drawn from (``+``, ``-``, ``*``); results
    stay non-negative (a subtraction is written larger-first).
    """
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise ValueError(f"retry: n must be an integer >= 0, got {n!r}")
    if isinstance(digits, bool) or not isinstance(digits, int) or not 1 <= digits <= 6:
        raise ValueError(f"retry: digits must be an integer in 1..6, got {digits!r}")
    ops = tuple(ops)
    if not ops or any(op not in ("+", "-", "*") for op in ops):
        raise ValueError(f"retry: ops must be a non-empty subset of ('+', '-', '*'), got {ops!r}")
    low, high = (0 if digits == 1 else 10 ** (digits - 1)), 10**digits - 1
    rows = []
    for index in range(n):
        rng = rng_for(seed, NAME, index)
        a, b = rng.randint(low, high), rng.randint(low, high)
        op = rng.choice(ops)
        if op == "-" and b > a:
            a, b = b, a
        value = evaluate([a, b], [op])
        info = {"task": NAME, "index": index, "numbers": [a, b], "op": op}
        rows.append({"prompt": f"{a}{op}{b}=", "answer": str(value), "info": info})
    return rows
