"""Difficulty presets shared by the procedural generators: a level picks a length range.

Standard library only.
"""

from __future__ import annotations

from collections.abc import Mapping


def length_range(task: str, n: int, level: int | None, levels: Mapping[int, tuple[int, int]], default: int,
                 min_len: int | None, max_len: int | None) -> tuple[int, int]:
    """``(min_len, max_len)``: the preset of ``level`` (``default`` when None), overridden by the
    explicit bounds; bad values fail naming ``task`` and the option."""
    if n < 0:
        raise ValueError(f"{task}: n must be >= 0, got {n}")
    if level is not None and level not in levels:
        raise ValueError(f"{task}: level must be one of {sorted(levels)}, got {level!r}")
    low, high = levels[default if level is None else level]
    min_len = low if min_len is None else min_len
    max_len = high if max_len is None else max_len
    if min_len < 1:
        raise ValueError(f"{task}: min_len must be >= 1, got {min_len}")
    if max_len < min_len:
        raise ValueError(f"{task}: max_len ({max_len}) must be >= min_len ({min_len})")
    return min_len, max_len
