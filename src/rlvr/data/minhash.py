"""MinHash-LSH over the distinctive token bigrams of prompts: the candidate step of the near-duplicate
check (:mod:`rlvr.data.twins`), whose candidates are then checked exactly.

A prompt's shingles are its token bigrams, each hashed with CRC-32 (:func:`shingles`). Bigrams that
more than :func:`common_limit` prompts of the corpus share (a template's or an instruction's words)
are left out (:func:`common_shingles`), so that two prompts are compared by what makes each of them
itself: "Translate into French: the cat sleeps" and "...: the dog runs" share their template, not
their question. A prompt with fewer than :data:`MIN_SHINGLES` distinctive bigrams is compared exactly
only.

Its signature is, for each of :data:`PERMS` multiply-shift hash functions ``h(x) = ((a·x + b) mod
2^64) >> 32``, the least ``h`` over its distinctive bigrams: two prompts agree in one place with
probability equal to the Jaccard similarity of those sets. The signature is cut into :data:`BANDS`
bands of :data:`ROWS` values, and each band hashed together with the prompt's numbers
(:func:`numbers_hash`), so only prompts with the same numbers, in order, can ever be candidates
(digits are never fuzzed away). With 15 bands of 2, a pair at Jaccard 0.5 shares a band with
probability 0.987, at 0.7 with 0.99998, at 0.2 with 0.46 (then refused by the exact check).

Every constant and step is fixed (no ``hash()``, no process salt): band hashes are the same on every
machine, and the numpy path (used when numpy imports, for speed) computes exactly the values of the
pure-Python one. Standard library, numpy optional.
"""

from __future__ import annotations

import hashlib
import zlib
from array import array
from collections import Counter
from collections.abc import Sequence
from typing import Any

PERMS = 30
BANDS = 15
ROWS = PERMS // BANDS
MIN_SHINGLES = 3
M64 = (1 << 64) - 1
_MIX = 0x9E3779B97F4A7C15  # odd: multiplying by it permutes 64-bit values
_SALTS = [int.from_bytes(hashlib.sha256(f"rlvr-minhash-{i}".encode()).digest()[:16], "big") for i in range(PERMS)]
A = [(s >> 64) | 1 for s in _SALTS]
B = [s & M64 for s in _SALTS]
_BATCH = 1 << 16  # shingles hashed at once by the numpy path (PERMS x 8 bytes each)


def shingles(tokens: Sequence[str]) -> list[int]:
    """The distinct CRC-32 hashes of the token bigrams (of the single token, for a one-token prompt)."""
    if len(tokens) < 2:
        return [zlib.crc32(t.encode()) for t in tokens]
    return list({zlib.crc32(f"{a} {b}".encode()) for a, b in zip(tokens, tokens[1:], strict=False)})


def numbers_hash(numbers: Sequence[str]) -> int:
    return int.from_bytes(hashlib.blake2b(" ".join(numbers).encode(), digest_size=8).digest(), "big")


def common_limit(n_prompts: int) -> int:
    """A bigram in more than this many prompts is common: 1% of them, and at least 16."""
    return max(16, n_prompts // 100)


def common_shingles(flat: array, n_prompts: int) -> frozenset[int]:
    """The bigrams (``flat``: every prompt's distinct bigrams, concatenated) in more than
    :func:`common_limit` prompts."""
    limit = common_limit(n_prompts)
    np = _numpy()
    if np is None:
        return frozenset(x for x, c in Counter(flat).items() if c > limit)
    values, counts = np.unique(np.frombuffer(flat, dtype=np.uint32), return_counts=True)
    return frozenset(values[counts > limit].tolist())


def rare(xs: Sequence[int], common: frozenset[int]) -> list[int]:
    return [x for x in xs if x not in common]


def _bands_of(sig: Sequence[int], nums: int) -> list[int]:
    out = []
    for j in range(BANDS):
        h = (nums ^ (j * _MIX)) & M64
        for v in sig[j * ROWS:(j + 1) * ROWS]:
            h = ((h ^ v) * _MIX) & M64
            h ^= h >> 29
        out.append(h)
    return out


def signature(xs: Sequence[int]) -> list[int]:
    """The pure-Python MinHash signature of shingle hashes ``xs`` (non-empty)."""
    return [min(((a * x + b) & M64) >> 32 for x in xs) for a, b in zip(A, B, strict=True)]


def band_hashes(sets: Sequence[Sequence[int]], numbers: Sequence[int]) -> array:
    """The :data:`BANDS` band hashes of each shingle set (each non-empty), flat: set ``i`` at
    ``[i * BANDS, (i + 1) * BANDS)``."""
    out = array("Q")
    np = _numpy()
    if np is None or len(sets) < 64:
        for xs, n in zip(sets, numbers, strict=True):
            out.extend(_bands_of(signature(xs), n))
        return out
    a, b = np.array(A, dtype=np.uint64), np.array(B, dtype=np.uint64)
    lo = 0
    while lo < len(sets):
        hi, total = lo, 0
        while hi < len(sets) and (hi == lo or total + len(sets[hi]) <= _BATCH):
            total += len(sets[hi])
            hi += 1
        out.frombytes(_bands_numpy(np, sets[lo:hi], numbers[lo:hi], a, b).tobytes())
        lo = hi
    return out


def _bands_numpy(np: Any, sets: Sequence[Sequence[int]], numbers: Sequence[int], a: Any, b: Any) -> Any:
    lengths = np.fromiter(map(len, sets), dtype=np.int64, count=len(sets))
    flat = np.fromiter((x for xs in sets for x in xs), dtype=np.uint64, count=int(lengths.sum()))
    starts = np.concatenate(([0], np.cumsum(lengths)[:-1]))
    mix, s29 = np.uint64(_MIX), np.uint64(29)
    with np.errstate(over="ignore"):
        sig = np.minimum.reduceat((flat[:, None] * a[None, :] + b[None, :]) >> np.uint64(32), starts, axis=0)
        nums = np.fromiter(numbers, dtype=np.uint64, count=len(sets))
        cols = []
        for j in range(BANDS):
            h = nums ^ np.uint64((j * _MIX) & M64)
            for r in range(ROWS):
                h = (h ^ sig[:, j * ROWS + r]) * mix
                h ^= h >> s29
            cols.append(h)
    return np.ascontiguousarray(np.stack(cols, axis=1))


def shared_bands(bands: array, n: int) -> list[list[int]]:
    """Groups (two or more) of set indices that share a band hash in one band, each group sorted."""
    np = _numpy()
    groups: list[list[int]] = []
    if np is None:
        for j in range(BANDS):
            bucket: dict[int, list[int]] = {}
            for i in range(n):
                bucket.setdefault(bands[i * BANDS + j], []).append(i)
            groups.extend(g for g in bucket.values() if len(g) > 1)
        return groups
    matrix = np.frombuffer(bands, dtype=np.uint64).reshape(n, BANDS)
    for j in range(BANDS):
        order = np.argsort(matrix[:, j], kind="stable")
        col = matrix[order, j]
        edges = np.flatnonzero(col[1:] != col[:-1]) + 1
        starts = np.concatenate(([0], edges))
        ends = np.concatenate((edges, [n]))
        for s, e in zip(starts[ends - starts > 1].tolist(), ends[ends - starts > 1].tolist(), strict=True):
            groups.append(sorted(order[s:e].tolist()))
    return groups


_NUMPY: list[Any] = []


def _numpy() -> Any:
    """numpy, when it is installed (imported on first use); ``None`` otherwise."""
    if not _NUMPY:
        try:
            import numpy
        except ImportError:
            numpy = None  # type: ignore[assignment]
        _NUMPY.append(numpy)
    return _NUMPY[0]


def jaccard(x: set[int], y: set[int]) -> float:
    return len(x & y) / len(x | y) if x or y else 1.0
