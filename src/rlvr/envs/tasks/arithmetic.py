"""Procedural arithmetic: a verifiable task that needs no download.

Rows look like ``{"prompt": "37+45=", "answer": "82", "info": {...}}``. The default is addition
of two 2-digit numbers; harder variants add digits, operands, or the ``-`` and ``*`` operators.
Rows are a pure function of ``(seed, index, options)``: each row draws from its own
``random.Random`` seeded from those coordinates, so ``make_rows(10, seed=s)[:5]`` equals
``make_rows(5, seed=s)`` and no global RNG is touched.

Other procedural tasks follow the same shape: ``NAME``, ``make_rows(n, *, seed, ...)``,
``parse_answer(text)`` and ``reward_fn(messages, answer) -> float``.

Standard library only; this module must not import torch or any optional package.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from rlvr.seeding import rng_for

NAME = "arithmetic"
OPERATORS = ("+", "-", "*")

_INT = re.compile(r"[+-]?[0-9]+")
# Bounded retries when non-negative results are required; past this the options are unsatisfiable
# in practice (e.g. many subtractions of same-sized numbers) and we say so instead of looping.
_MAX_DRAWS = 1000


def make_rows(
    n: int,
    *,
    seed: int,
    digits: int = 2,
    operands: int = 2,
    ops: Sequence[str] = ("+",),
    allow_negative: bool = False,
) -> list[dict[str, Any]]:
    """``n`` arithmetic rows, deterministic from ``seed`` and the options.

    ``digits``: every operand has exactly this many digits (1 means 0-9).
    ``operands``: how many numbers each expression has (at least 2).
    ``ops``: the operators to draw from, any of ``+ - *``; ``*`` binds tighter, as in Python.
    ``allow_negative``: when False, expressions whose value is negative are redrawn.
    """
    _check_options(n, digits, operands, ops)
    options = (digits, operands, tuple(ops), allow_negative)
    return [_make_row(seed, i, options) for i in range(n)]


def _check_options(n: int, digits: int, operands: int, ops: Sequence[str]) -> None:
    if n < 0:
        raise ValueError(f"arithmetic: n must be >= 0, got {n}")
    if digits < 1:
        raise ValueError(f"arithmetic: digits must be >= 1, got {digits}")
    if operands < 2:
        raise ValueError(f"arithmetic: operands must be >= 2, got {operands}")
    bad = [op for op in ops if op not in OPERATORS]
    if bad or not ops:
        raise ValueError(f"arithmetic: ops must be a non-empty subset of {OPERATORS}, got {ops!r}")


def _make_row(seed: int, index: int, options: tuple) -> dict[str, Any]:
    digits, operands, ops, allow_negative = options
    rng = rng_for(seed, NAME, index)
    low = 0 if digits == 1 else 10 ** (digits - 1)
    high = 10**digits - 1
    for _ in range(_MAX_DRAWS):
        numbers = [rng.randint(low, high) for _ in range(operands)]
        chosen = [rng.choice(ops) for _ in range(operands - 1)]
        value = evaluate(numbers, chosen)
        if allow_negative or value >= 0:
            break
    else:
        raise ValueError(
            f"arithmetic: no non-negative expression in {_MAX_DRAWS} draws for ops={ops!r}, "
            f"operands={operands}; pass allow_negative=True"
        )
    prompt = "".join(f"{x}{op}" for x, op in zip(numbers[:-1], chosen, strict=True)) + f"{numbers[-1]}="
    info = {"task": NAME, "index": index, "digits": digits, "numbers": numbers, "ops": chosen}
    return {"prompt": prompt, "answer": str(value), "info": info}


def evaluate(numbers: Sequence[int], ops: Sequence[str]) -> int:
    """Value of ``numbers[0] ops[0] numbers[1] ...`` with ``*`` before ``+``/``-``.

    Written out rather than ``eval``-ed so the task stays obviously safe.
    """
    if len(ops) != len(numbers) - 1:
        raise ValueError(f"arithmetic: {len(numbers)} numbers need {len(numbers) - 1} operators")
    terms = [numbers[0]]
    signs = [1]
    for op, x in zip(ops, numbers[1:], strict=True):
        if op == "*":
            terms[-1] *= x
        else:
            terms.append(x)
            signs.append(1 if op == "+" else -1)
    return sum(s * t for s, t in zip(signs, terms, strict=True))


def parse_answer(text: str, *, strict: bool = True) -> int | None:
    """The integer a reply states, or None.

    ``strict`` (the default, used for rewards): the whole reply, once surrounding whitespace is
    stripped, must be one integer; so "82" and " 82\\n" parse but "82 apples" does not. This keeps
    a small policy from being paid for padding its answer with extra digits or words.
    ``strict=False``: the last integer anywhere in the text, for chatty models ("... = 82.").
    """
    if not isinstance(text, str):
        return None
    text = text.strip()
    if strict:
        return int(text) if _INT.fullmatch(text) else None
    found = _INT.findall(text)
    return int(found[-1]) if found else None


def reward_fn(messages: Sequence[Mapping[str, Any]], answer: str | int) -> float:
    """1.0 when the last assistant message states ``answer`` exactly, else 0.0.

    Unparsable output is 0.0 (see :func:`parse_answer`, strict mode). A conversation with no
    assistant message is a caller bug, not a wrong answer, so it raises.
    """
    reply = _last_assistant_content(messages)
    value = parse_answer(reply)
    return 1.0 if value is not None and value == int(answer) else 0.0


def _last_assistant_content(messages: Sequence[Mapping[str, Any]]) -> str:
    for message in reversed(messages):
        if message.get("role") == "assistant":
            content = message.get("content")
            return content if isinstance(content, str) else ""
    raise ValueError(
        "arithmetic.reward_fn: messages hold no assistant message; pass the conversation "
        "including the model's reply as {'role': 'assistant', 'content': ...}"
    )
