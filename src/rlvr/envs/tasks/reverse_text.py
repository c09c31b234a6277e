"""Procedural string reversal: ``"rev:abcd="`` → ``"dcba"``.

Rows look like ``{"prompt": "rev:abcd=", "answer": "dcba", "info": {...}}``; the strings are
random letters from ``alphabet`` (lowercase ASCII by default). Palindromes are redrawn unless
``allow_palindromes`` (a model that copies its input should not be paid). Rows are a pure
function of ``(seed, index, options)`` as in :mod:`rlvr.envs.tasks.arithmetic`, so a shorter draw is
a prefix of a longer one.

Difficulty is the length range: ``level`` picks ``(min_len, max_len)`` from :data:`LEVELS`
(default 2: 3 to 6 characters); explicit ``min_len``/``max_len`` override it.

Standard library only.
"""

from __future__ import annotations

import string
from collections.abc import Mapping, Sequence
from typing import Any

from rlvr.envs.parsing import last_assistant_text
from rlvr.envs.tasks.levels import length_range
from rlvr.seeding import rng_for

NAME = "reverse_text"
LEVELS: dict[int, tuple[int, int]] = {1: (2, 4), 2: (3, 6), 3: (5, 8), 4: (8, 12)}
DEFAULT_LEVEL = 2
_MAX_DRAWS = 1000


def make_rows(
    n: int,
    *,
    seed: int,
    level: int | None = None,
    min_len: int | None = None,
    max_len: int | None = None,
    alphabet: str = string.ascii_lowercase,
    allow_palindromes: bool = False,
) -> list[dict[str, Any]]:
    """``n`` reversal rows, deterministic from ``seed`` and the options.

    ``level``: a preset length range from :data:`LEVELS` (default 2). ``min_len``/``max_len``:
    the length range (inclusive), overriding the preset. ``alphabet``: the characters drawn from
    (no whitespace). ``allow_palindromes``: keep strings that read the same both ways.
    """
    options = _resolve(n, level, min_len, max_len, alphabet, allow_palindromes)
    return [_make_row(seed, i, options) for i in range(n)]


def _resolve(n: int, level: int | None, min_len: int | None, max_len: int | None, alphabet: str,
             allow_palindromes: bool) -> tuple:
    min_len, max_len = length_range("reverse_text", n, level, LEVELS, DEFAULT_LEVEL, min_len, max_len)
    if not isinstance(alphabet, str) or not alphabet or any(ch.isspace() or not ch.isprintable() for ch in alphabet):
        raise ValueError(f"reverse_text: alphabet must be a non-empty string of printable, non-space characters, "
                         f"got {alphabet!r}")
    symbols = "".join(sorted(set(alphabet)))
    if not allow_palindromes and (min_len < 2 or len(symbols) < 2):
        raise ValueError(f"reverse_text: without allow_palindromes, min_len must be >= 2 and the alphabet needs "
                         f"2 distinct characters (got min_len={min_len}, alphabet={alphabet!r})")
    return min_len, max_len, symbols, allow_palindromes, level


def _make_row(seed: int, index: int, options: tuple) -> dict[str, Any]:
    min_len, max_len, symbols, allow_palindromes, level = options
    rng = rng_for(seed, NAME, index)
    length = rng.randint(min_len, max_len)
    for _ in range(_MAX_DRAWS):
        text = "".join(rng.choice(symbols) for _ in range(length))
        if allow_palindromes or text != text[::-1]:
            break
    else:  # pragma: no cover - vanishingly unlikely with 2+ symbols and length >= 2
        raise ValueError(f"reverse_text: no non-palindrome in {_MAX_DRAWS} draws")
    info = {"task": NAME, "index": index, "text": text, "length": length, "level": level}
    return {"prompt": f"rev:{text}=", "answer": text[::-1], "info": info}


def parse_answer(text: str) -> str | None:
    """The string a reply states: the whole reply, stripped, with no inner whitespace; else None."""
    if not isinstance(text, str):
        return None
    text = text.strip()
    return text if text and not any(ch.isspace() for ch in text) else None


def reward_fn(messages: Sequence[Mapping[str, Any]], answer: str) -> float:
    """1.0 when the last assistant message is exactly ``answer`` (surrounding whitespace aside), else 0.0."""
    if not isinstance(answer, str) or not answer:
        raise ValueError(f"reverse_text.reward_fn: answer must be a non-empty string, got {answer!r}")
    value = parse_answer(last_assistant_text(messages, who="reverse_text.reward_fn"))
    return 1.0 if value == answer.strip() else 0.0
