"""A prefix that several rows repeat, read once and its key/value cache copied to each row.

Both the generator (a group's prompt before sampling, :mod:`~rlvr.backends.sample.prefix`) and the
trainer (the same prompt before scoring its completions, :mod:`~rlvr.backends.train.shared_prefix`)
read each distinct prompt once. :func:`distinct` finds the distinct rows; :func:`copied_cache`
runs the model over them with no vocabulary-wide head and copies the cache per row with
``index_select``, so with gradients on, the backward pass sums every copy's gradient into its one
prefix.

A backend module: imports torch and transformers.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Any, TypeVar

import torch
from transformers import DynamicCache

from rlvr.backends.model import precision
from rlvr.backends.model.io import cache_kwarg, takes_logits_to_keep

H = TypeVar("H", bound=Hashable)


def distinct(rows: Sequence[H]) -> tuple[list[H], list[int]]:
    """The distinct rows in order of first appearance, and each row's index among them."""
    first: dict[H, int] = {}
    index = [first.setdefault(row, len(first)) for row in rows]
    return list(first), index


def copied_cache(model: Any, inputs: dict[str, Any], rows: torch.Tensor,
                 cache: DynamicCache | None = None) -> DynamicCache:
    """The KV cache of ``inputs`` (one row per distinct prefix), row ``i`` of the result a copy of
    prefix ``rows[i]``. Only the body runs where the model has a plain body/head split; otherwise the
    whole model, its head on one position where it can. ``cache``: an empty cache (of a
    ``DynamicCache`` subclass) to fill instead of a new ``DynamicCache``."""
    cache = DynamicCache(config=model.config) if cache is None else cache
    parts = precision.split_head(model)
    if parts is not None:
        parts[0](**inputs, **{cache_kwarg(parts[0]): cache}, use_cache=True)
    else:
        model(**inputs, **{cache_kwarg(model): cache}, use_cache=True,
              **({"logits_to_keep": 1} if takes_logits_to_keep(model) else {}))
    cache.reorder_cache(rows)  # type: ignore[arg-type]  # any integer tensor indexes
    return cache
