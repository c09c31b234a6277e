"""Counter-based random numbers for seeded sampling: one uniform per (row seed, decode position).

A row's draw at decode position ``t`` is a pure function of its seed and ``t``, computed on the
model's device for the whole batch at once with integer tensor ops: no generator state, no host
round trip, nothing that depends on which other rows share the batch. This is what makes a
completion a function of its prompt and seed alone, and a resumed run draw what an uninterrupted
one drew.

The hash is murmur3's 32-bit finaliser (``fmix32``, a bijection of 32-bit words) chained over the
position and the seed's two 32-bit halves, in two lanes with different keys whose outputs make the
53 bits of a float64 uniform in ``[0, 1)``. Every value is held in int64 and kept below ``2**49``:
a 32-bit word times a 32-bit constant is done as two products with the constant's 16-bit halves,
so no intermediate overflows (signed overflow is undefined in the kernels torch runs). The same
functions run on Python ints (the per-position part is computed on the host once per step) and on
tensors (the per-row part), bit for bit alike.

A backend module: imports torch.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

import torch

MASK32 = 0xFFFFFFFF
# Two lanes, keyed apart: each gives 32 bits, together a 53-bit mantissa.
LANE_KEYS = (0x9E3779B9, 0x7F4A7C15)
_MIX_A, _MIX_B = 0x85EBCA6B, 0xC2B2AE35  # murmur3 fmix32 constants

Word = TypeVar("Word", int, torch.Tensor)


def _mul32(x: Word, constant: int) -> Word:
    """``(x * constant) mod 2**32`` for a 32-bit ``x``, every intermediate below ``2**49``."""
    low, high = constant & 0xFFFF, constant >> 16
    return (x * low + (((x * high) & 0xFFFF) << 16)) & MASK32


def mix32(x: Word) -> Word:
    """murmur3's ``fmix32``: a bijection of 32-bit words whose every output bit depends on every input bit."""
    x = x ^ (x >> 16)
    x = _mul32(x, _MIX_A)
    x = x ^ (x >> 13)
    x = _mul32(x, _MIX_B)
    return x ^ (x >> 16)


def row_keys(seeds: Sequence[int], device: torch.device | str) -> torch.Tensor:
    """``[2, B]`` int64: each seed (any Python int, taken modulo ``2**64``) split into its low and
    high 32-bit halves, on ``device``, once per batch."""
    words = [s % (1 << 64) for s in seeds]
    return torch.tensor([[w & MASK32 for w in words], [w >> 32 for w in words]], dtype=torch.int64, device=device)


def _lane(keys: torch.Tensor, position: int, lane_key: int) -> torch.Tensor:
    head = mix32((position & MASK32) ^ lane_key)  # the same for every row: a host int
    return mix32(mix32(keys[0] ^ head) ^ (keys[1] ^ lane_key))


def uniforms(keys: torch.Tensor, position: int) -> torch.Tensor:
    """``[B]`` float64 in ``[0, 1)``: row ``b``'s uniform at decode ``position`` (``keys`` from
    :func:`row_keys`). Distinct positions and distinct seeds give independent-looking draws."""
    high = _lane(keys, position, LANE_KEYS[0])
    low = _lane(keys, position, LANE_KEYS[1])
    bits = (high << 21) | (low >> 11)  # 53 bits, below 2**53
    return bits.to(torch.float64) * (1.0 / (1 << 53))


def uniform(seed: int, position: int) -> float:
    """:func:`uniforms` for one seed, in plain Python (tests and tools check the tensor path with it)."""
    words = (seed % (1 << 64)) & MASK32, (seed % (1 << 64)) >> 32
    lanes = []
    for lane_key in LANE_KEYS:
        head = mix32((position & MASK32) ^ lane_key)
        lanes.append(mix32(mix32(words[0] ^ head) ^ (words[1] ^ lane_key)))
    return ((lanes[0] << 21) | (lanes[1] >> 11)) / (1 << 53)
