"""Procedural sorting: ``"sort:3,1,2="`` → ``"1,2,3"``.

Rows look like ``{"prompt": "sort:3,1,2=", "answer": "1,2,3", "info": {...}}``: a short list of
small non-negative integers (repeats allowed) to sort ascending. Lists that are already sorted
are redrawn unless ``allow_sorted`` (a model that copies its input should not be paid). Rows are
a pure function of ``(seed, index, options)`` as in :mod:`rlvr.envs.tasks.arithmetic`, so a shorter
draw is a prefix of a longer one.

Difficulty is the list length: ``level`` picks ``(min_len, max_len)`` from :data:`LEVELS`
(default 2: 3 to 5 numbers of 0-9, answers at most 9 characters); explicit options override it.

Standard library only.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from numbers import Integral
from typing import Any

from rlvr.envs.parsing import last_assistant_text
from rlvr.envs.tasks.levels import length_range
from rlvr.seeding import rng_for

NAME = "sorting"
LEVELS: dict[int, tuple[int, int]] = {1: (2, 3), 2: (3, 5), 3: (5, 6), 4: (6, 8)}
DEFAULT_LEVEL = 2
_LIST = re.compile(r"-?[0-9]+(?:\s*,\s*-?[0-9]+)*")
_MAX_DRAWS = 1000


def make_rows(
    n: int,
    *,
    seed: int,
    level: int | None = None,
    min_len: int | None = None,
    max_len: int | None = None,
    max_value: int = 9,
    allow_sorted: bool = False,
) -> list[dict[str, Any]]:
    """``n`` sorting rows, deterministic from ``seed`` and the options.

    ``level``: a preset length range from :data:`LEVELS` (default 2). ``min_len``/``max_len``:
    the list length range (inclusive), overriding the preset. ``max_value``: numbers are drawn
    from 0..max_value. ``allow_sorted``: keep lists that are already in order.
    """
    options = _resolve(n, level, min_len, max_len, max_value, allow_sorted)
    return [_make_row(seed, i, options) for i in range(n)]


def _resolve(n: int, level: int | None, min_len: int | None, max_len: int | None, max_value: int,
             allow_sorted: bool) -> tuple:
    min_len, max_len = length_range("sorting", n, level, LEVELS, DEFAULT_LEVEL, min_len, max_len)
    if max_value < 0:
        raise ValueError(f"sorting: max_value must be >= 0, got {max_value}")
    if not allow_sorted and (min_len < 2 or max_value < 1):
        raise ValueError(f"sorting: without allow_sorted, min_len must be >= 2 and max_value >= 1 so an unsorted "
                         f"list exists (got min_len={min_len}, max_value={max_value})")
    return min_len, max_len, max_value, allow_sorted, level


def _make_row(seed: int, index: int, options: tuple) -> dict[str, Any]:
    min_len, max_len, max_value, allow_sorted, level = options
    rng = rng_for(seed, NAME, index)
    length = rng.randint(min_len, max_len)
    for _ in range(_MAX_DRAWS):
        values = [rng.randint(0, max_value) for _ in range(length)]
        if allow_sorted or values != sorted(values):
            break
    else:  # pragma: no cover - needs ~1000 sorted draws in a row
        raise ValueError(f"sorting: no unsorted list in {_MAX_DRAWS} draws")
    info = {"task": NAME, "index": index, "values": values, "level": level}
    return {"prompt": f"sort:{_join(values)}=", "answer": _join(sorted(values)), "info": info}


def _join(values: Sequence[int]) -> str:
    return ",".join(str(v) for v in values)


def parse_answer(text: str) -> list[int] | None:
    """The integers a reply lists, comma-separated; None unless the whole stripped reply is such a list."""
    if not isinstance(text, str):
        return None
    text = text.strip()
    if not _LIST.fullmatch(text):
        return None
    return [int(part) for part in text.split(",")]


def reward_fn(messages: Sequence[Mapping[str, Any]], answer: str | Sequence[int]) -> float:
    """1.0 when the last assistant message lists ``answer``'s numbers in ascending order, else 0.0.

    ``answer`` is the sorted list as text (``"1,2,3"``) or a list of integers (sorted here).
    """
    if isinstance(answer, str):
        gold = parse_answer(answer)
    elif isinstance(answer, Sequence) and all(isinstance(x, Integral) and not isinstance(x, bool) for x in answer):
        gold = [int(x) for x in answer]
    else:
        gold = None
    if not gold:
        raise ValueError(f"sorting.reward_fn: answer must be a list of integers or text like '1,2,3', got {answer!r}")
    value = parse_answer(last_assistant_text(messages, who="sorting.reward_fn"))
    return 1.0 if value == sorted(gold) else 0.0
