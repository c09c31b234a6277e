"""The near-duplicate check against rows known only by hashes: what a lineage file keeps of the rows
a model was trained on, so that a later run's held-out rows (or ``rlvr eval --data`` rows) are
checked against them as the split checks a corpus (:mod:`rlvr.data.twins`), without the rows.

A :class:`Part` holds, for one set of rows: the MinHash-LSH band hashes of their prompts (and the
common bigrams those were computed without, :mod:`rlvr.data.minhash`), the sentence-segment hashes
of their multi-segment prompts, and the segment-sequence hash of each prompt long enough to be quoted.
A row matches a part when it is (besides having the same split key, checked by the caller):

- **near**: at least :data:`NEAR_BANDS` of its band hashes are among the part's (no exact check is
  possible without the rows: three bands, where the split asks one and then checks exactly; at
  Jaccard 0.5 that is 76% likely, at 0.7 over 99%, at 0.3 15%);
- **quoted in** a row of the part: each of its segments is a segment of the part's prompts;
- **quoting** a row of the part: a run of its segments is a whole prompt of the part.

Hashes are 64-bit and stored packed (base64 of big-endian 8-byte values): about 200 bytes a row.
Standard library, numpy optional.
"""

from __future__ import annotations

import base64
import hashlib
import sys
from array import array
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rlvr.data import minhash
from rlvr.data.normal import Shape, prompt_shape
from rlvr.data.twins import MIN_QUOTE_TOKENS, read_prompts, segment_hash
from rlvr.types import Task

NEAR_BANDS = 3
MAX_SEGMENTS = 64  # a query's segment runs looked up: at most this many segments of it


def sequence_hash(segments: Iterable[int]) -> int:
    return int.from_bytes(hashlib.blake2b(array("q", segments).tobytes(), digest_size=8).digest(), "big",
                          signed=True)


def _pack(values: Iterable[int]) -> str:
    packed = array("Q", sorted(v & minhash.M64 for v in values))
    if sys.byteorder == "little":
        packed.byteswap()
    return base64.b64encode(packed.tobytes()).decode()


def _unpack(text: str) -> frozenset[int]:
    values = array("Q")
    values.frombytes(base64.b64decode(text))
    if sys.byteorder == "little":
        values.byteswap()
    return frozenset(values)


@dataclass(frozen=True)
class Part:
    """What the near-duplicate check needs of one set of rows (see the module doc); hashes unsigned."""

    common: frozenset[int]
    bands: frozenset[int]
    segments: frozenset[int]
    quotable: frozenset[int]

    @classmethod
    def of(cls, tasks: Sequence[Task]) -> Part:
        p = read_prompts(tasks)
        common = minhash.common_shingles(p.shingles, len(p.fuzzy))
        sets, nums = [], []
        for f in range(len(p.fuzzy)):
            own = minhash.rare(p.bigrams(f), common)
            if len(own) >= minhash.MIN_SHINGLES:
                sets.append(own)
                nums.append(p.numbers[f])
        segments: set[int] = set()
        quotable: set[int] = set()
        for k in range(len(p.keys)):
            segs = p.segments(k)
            if len(segs) >= 2:
                segments.update(s & minhash.M64 for s in segs)
            if segs and p.tokens[k] >= MIN_QUOTE_TOKENS:
                quotable.add(sequence_hash(segs) & minhash.M64)
        return cls(common, frozenset(minhash.band_hashes(sets, nums)), frozenset(segments), frozenset(quotable))

    def to_json(self) -> dict[str, Any]:
        return {"common": sorted(self.common), "bands": _pack(self.bands), "segments": _pack(self.segments),
                "quotable": _pack(self.quotable)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Part:
        return cls(frozenset(int(x) for x in data.get("common", [])), _unpack(data.get("bands", "")),
                   _unpack(data.get("segments", "")), _unpack(data.get("quotable", "")))

    def matches(self, shapes: Sequence[Shape]) -> list[bool]:
        """Whether each prompt (its :class:`~rlvr.data.normal.Shape`) matches this part."""
        found = [False] * len(shapes)
        if self.bands:
            sets, nums, which = [], [], []
            for i, shape in enumerate(shapes):
                own = minhash.rare(minhash.shingles(shape.tokens), self.common) if shape.tokens else []
                if len(own) >= minhash.MIN_SHINGLES:
                    sets.append(own)
                    nums.append(minhash.numbers_hash(shape.numbers))
                    which.append(i)
            bands = minhash.band_hashes(sets, nums)
            for n, i in enumerate(which):
                found[i] = sum(b in self.bands for b in bands[n * minhash.BANDS:(n + 1) * minhash.BANDS]) >= NEAR_BANDS
        for i, shape in enumerate(shapes):
            if not found[i] and shape.segments:
                found[i] = self._quote(shape)
        return found

    def _quote(self, shape: Shape) -> bool:
        segs = [segment_hash(s) for s in shape.segments[:MAX_SEGMENTS]]
        if len(shape.tokens) >= MIN_QUOTE_TOKENS and all(s & minhash.M64 in self.segments for s in segs):
            return True
        return any(sequence_hash(segs[i:j]) & minhash.M64 in self.quotable
                   for i in range(len(segs)) for j in range(i + 1, len(segs) + 1) if j - i < len(segs))


def parts_of(data: Any) -> list[Part]:
    """The parts a lineage file lists (none when it lists none, or not as parts)."""
    if not isinstance(data, list):
        return []
    return [Part.from_json(d) for d in data if isinstance(d, Mapping)]


def near_matches(tasks: Sequence[Task], parts: Sequence[Part]) -> list[bool]:
    """Whether each task matches one of ``parts`` (see the module doc)."""
    shapes = [prompt_shape(t) for t in tasks]
    found = [False] * len(tasks)
    for part in parts:
        found = [f or m for f, m in zip(found, part.matches(shapes), strict=True)]
    return found
