"""Handing answers to the callers waiting on them: one future per sample, each given its result or its
error once (a future already done, e.g. cancelled by its caller, is left alone). Shared by every
generator that batches several callers' samples into one request. Standard library only."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any


def resolve(future: asyncio.Future, result: Any) -> None:
    """``future`` gets ``result``, raised if it is an exception; nothing if it is already done."""
    if future.done():
        return
    if isinstance(result, BaseException):
        future.set_exception(result)
    else:
        future.set_result(result)


def settle(futures: Sequence[asyncio.Future], results: Sequence[Any]) -> None:
    """Each future its own result, in order."""
    for future, result in zip(futures, results, strict=True):
        resolve(future, result)
