"""Near-duplicate clusters of a corpus: rows that are one question for the held-out split.

Rows join one cluster (union-find over distinct normal prompts, :mod:`rlvr.data.normal`) when:

- **same prompt**: their normal prompts are equal, whatever their answers;
- **near**: their normal prompts have the same numbers, in order, and the Jaccard similarity of their
  distinctive token bigrams (those not common to the corpus's template) is at least :data:`JACCARD`
  (candidates from MinHash-LSH, :mod:`rlvr.data.minhash`; every candidate pair is checked exactly).
  "What is 12 plus 13?" and "What is 12 plus 14?" never join: their numbers differ;
- **quoted**: one prompt of at least :data:`MIN_QUOTE_TOKENS` tokens appears whole, as a run of
  sentence segments (between sentence punctuation, "=", line and message breaks), inside another: the
  held-out question as the last turn of a few-shot prompt, or followed by "Answer with a number only.".

A prompt quoted inside more than :data:`QUOTE_LIMIT` other prompts (a few-shot exemplar every prompt
shows) joins none of them: it is *pinned* to the training side, where it is seen anyway, instead of
gluing them all into one cluster. Token-in rows (``info.prompt_ids``) cluster by exact tokens only.

Work is linear in the corpus: one pass of normal forms, LSH bucketing by band hash, and an index of
only the segments that some prompt's rarest segment is. Deterministic by content: the clusters do
not depend on row order, ids or the machine. Standard library, numpy optional (faster).
"""

from __future__ import annotations

import hashlib
from array import array
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

from rlvr.data import minhash
from rlvr.data.normal import Shape, answer_text, prompt_shape
from rlvr.types import Task

JACCARD = 0.5
MIN_QUOTE_TOKENS = 4
QUOTE_LIMIT = 32
CENTERS = 4  # members of an LSH bucket are checked against at most this many of its earlier members


def segment_hash(segment: str) -> int:
    return int.from_bytes(hashlib.blake2b(segment.encode(), digest_size=8).digest(), "big", signed=True)


@dataclass
class Prompts:
    """The distinct prompts of a corpus: ``key_of_row[i]`` indexes ``keys`` (the 64-bit head of each
    split key), ``first_row[k]`` is a row of prompt ``k`` and ``rows[k]`` how many; its segment hashes
    at ``segs[seg_start[k]:seg_start[k + 1]]``, its token count ``tokens[k]``. ``fuzzy`` lists the
    prompts with bigrams enough for the near check, theirs at ``shingles[sh_start[f]:sh_start[f + 1]]``
    and their numbers' hash at ``numbers[f]``."""

    keys: list[int] = field(default_factory=list)
    key_of_row: array = field(default_factory=lambda: array("q"))
    first_row: list[int] = field(default_factory=list)
    rows: array = field(default_factory=lambda: array("q"))
    tokens: array = field(default_factory=lambda: array("q"))
    segs: array = field(default_factory=lambda: array("q"))
    seg_start: array = field(default_factory=lambda: array("q", [0]))
    fuzzy: array = field(default_factory=lambda: array("q"))
    shingles: array = field(default_factory=lambda: array("I"))
    sh_start: array = field(default_factory=lambda: array("q", [0]))
    numbers: array = field(default_factory=lambda: array("Q"))

    def segments(self, k: int) -> array:
        return self.segs[self.seg_start[k]:self.seg_start[k + 1]]

    def bigrams(self, f: int) -> array:
        return self.shingles[self.sh_start[f]:self.sh_start[f + 1]]


def read_prompts(tasks: Sequence[Task]) -> Prompts:
    p = Prompts()
    index: dict[int, int] = {}
    for i, task in enumerate(tasks):
        shape = prompt_shape(task)
        head = int(shape.key[:16], 16)
        k = index.get(head)
        if k is None:
            k = index[head] = len(p.keys)
            _add_prompt(p, shape, head, i)
        else:
            p.rows[k] += 1
        p.key_of_row.append(k)
    return p


def _add_prompt(p: Prompts, shape: Shape, head: int, row: int) -> None:
    k = len(p.keys)
    p.keys.append(head)
    p.first_row.append(row)
    p.rows.append(1)
    p.tokens.append(len(shape.tokens))
    p.segs.extend(segment_hash(s) for s in shape.segments)
    p.seg_start.append(len(p.segs))
    bigrams = minhash.shingles(shape.tokens)
    if len(bigrams) >= minhash.MIN_SHINGLES:
        p.fuzzy.append(k)
        p.shingles.extend(bigrams)
        p.sh_start.append(len(p.shingles))
        p.numbers.append(minhash.numbers_hash(shape.numbers))


class UnionFind:
    def __init__(self, n: int):
        self.parent = array("q", range(n))

    def find(self, x: int) -> int:
        parent = self.parent
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    def union(self, a: int, b: int) -> bool:
        ra, rb = self.find(a), self.find(b)
        if ra == rb:
            return False
        self.parent[max(ra, rb)] = min(ra, rb)
        return True


@dataclass
class Clusters:
    """The corpus's clusters: ``prompts`` (:class:`Prompts`), ``root[k]`` the cluster of prompt ``k``
    (its smallest prompt index), ``pinned`` the clusters that hold a widely quoted prompt, ``links``
    (``(prompt, prompt, "near" | "quoted")`` for each join of two clusters), ``hubs`` (a widely
    quoted prompt → prompts found quoting it), ``unchecked`` (prompts whose quotes were checked only in part) and
    ``conflicts`` (prompt → the rows of its distinct answers, for prompts with more than one)."""

    prompts: Prompts
    root: list[int]
    pinned: set[int]
    links: list[tuple[int, int, str]]
    hubs: dict[int, list[int]]
    unchecked: int
    conflicts: dict[int, list[int]]

    def cluster_of_row(self, row: int) -> int:
        return self.root[self.prompts.key_of_row[row]]


def find_clusters(tasks: Sequence[Task]) -> Clusters:
    """The near-duplicate clusters of ``tasks`` (see the module doc)."""
    p = read_prompts(tasks)
    uf = UnionFind(len(p.keys))
    links: list[tuple[int, int, str]] = []
    for a, b in _near_pairs(p):
        if uf.union(a, b):
            links.append((a, b, "near"))
    hubs, unchecked = _quotes(p, uf, links)
    root = [uf.find(k) for k in range(len(p.keys))]
    pinned = {root[k] for k in hubs}
    return Clusters(p, root, pinned, links, hubs, unchecked, _conflicts(p, tasks))


def _near_pairs(p: Prompts) -> list[tuple[int, int]]:
    """Pairs of prompts that share an LSH bucket and pass the exact check: the same numbers, and
    Jaccard of their distinctive bigrams at least :data:`JACCARD`."""
    common = minhash.common_shingles(p.shingles, len(p.fuzzy))
    eligible: list[int] = []  # indexes into p.fuzzy
    bands = array("Q")
    chunk: list[list[int]] = []
    for f in range(len(p.fuzzy)):
        own = minhash.rare(p.bigrams(f), common)
        if len(own) >= minhash.MIN_SHINGLES:
            eligible.append(f)
            chunk.append(own)
        if len(chunk) == 4096 or (chunk and f == len(p.fuzzy) - 1):
            bands.extend(minhash.band_hashes(chunk, [p.numbers[e] for e in eligible[len(eligible) - len(chunk):]]))
            chunk = []
    pairs: list[tuple[int, int]] = []
    checked: set[tuple[int, int]] = set()
    for group in minhash.shared_bands(bands, len(eligible)):
        members = sorted((eligible[i] for i in group), key=lambda f: p.keys[p.fuzzy[f]])  # by content, not order
        centers: list[int] = []
        for m in members:
            joined = False
            for c in centers:
                if (c, m) in checked:
                    continue
                checked.add((c, m))
                if p.numbers[c] == p.numbers[m] and minhash.jaccard(set(minhash.rare(p.bigrams(c), common)),
                                                                    set(minhash.rare(p.bigrams(m), common))) >= JACCARD:
                    pairs.append((p.fuzzy[c], p.fuzzy[m]))
                    joined = True
                    break
            if not joined and len(centers) < CENTERS:
                centers.append(m)
    return pairs


def _quotes(p: Prompts, uf: UnionFind, links: list[tuple[int, int, str]]) -> tuple[dict[int, list[int]], int]:
    """Joins each prompt with the prompts it is quoted in; returns the hubs (quoted in more than
    :data:`QUOTE_LIMIT` prompts) and how many prompts were checked in part."""
    n = len(p.keys)
    # By content, so which quotes a capped list keeps does not depend on row order.
    multi = sorted((k for k in range(n) if p.seg_start[k + 1] - p.seg_start[k] >= 2), key=p.keys.__getitem__)
    counts: Counter[int] = Counter()
    for k in multi:
        counts.update(p.segments(k))
    anchors: dict[int, tuple[int, int]] = {}  # prompt -> (its rarest segment, its position)
    for k in range(n):
        segs = p.segments(k)
        if p.tokens[k] < MIN_QUOTE_TOKENS or not segs:
            continue
        pos = min(range(len(segs)), key=lambda i: (counts[segs[i]], i))
        if counts[segs[pos]]:
            anchors[k] = (segs[pos], pos)
    wanted = {s for s, _ in anchors.values()}
    hits: dict[int, list[tuple[int, int]]] = {}
    for k in multi:
        for pos, s in enumerate(p.segments(k)):
            if s in wanted:
                found = hits.setdefault(s, [])
                if len(found) <= QUOTE_LIMIT + 1:
                    found.append((k, pos))
    hubs: dict[int, list[int]] = {}
    unchecked = 0
    for a, (s, pos) in anchors.items():
        inner = p.segments(a)
        quoting = sorted({b for b, at in hits.get(s, []) if b != a and _inside(inner, p.segments(b), at - pos)})
        if counts[s] > QUOTE_LIMIT + 1 and len(quoting) > QUOTE_LIMIT:
            hubs[a] = quoting
            continue
        unchecked += counts[s] > QUOTE_LIMIT + 2
        for b in quoting:
            if uf.union(a, b):
                links.append((a, b, "quoted"))
    return hubs, unchecked


def _inside(inner: array, outer: array, start: int) -> bool:
    return 0 <= start and start + len(inner) <= len(outer) and outer[start:start + len(inner)] == inner


def _conflicts(p: Prompts, tasks: Sequence[Task]) -> dict[int, list[int]]:
    """Prompts whose rows give more than one answer (in normal form): prompt → a row of each answer."""
    seen: dict[int, dict[str, int]] = {}
    for i, k in enumerate(p.key_of_row):
        if p.rows[k] > 1:
            seen.setdefault(k, {}).setdefault(answer_text(tasks[i]), i)
    return {k: sorted(answers.values()) for k, answers in seen.items() if len(answers) > 1}


def twins_of(sides: Sequence[Sequence[Task]], tasks: Sequence[Task]) -> list[list[bool]]:
    """For each of ``sides`` (a split's training and held-out rows, say), whether each of ``tasks`` is
    one question with a row of that side: in one cluster with it, or a widely quoted prompt that a row
    of it quotes (the check the split makes, across sets). The rows are clustered once, all together."""
    found = find_clusters([*(t for side in sides for t in side), *tasks])
    key_of_row = found.prompts.key_of_row
    asked = key_of_row[len(key_of_row) - len(tasks):]
    out, start = [], 0
    for side in sides:
        prompts = set(key_of_row[start:start + len(side)])
        start += len(side)
        clusters = {found.root[k] for k in prompts}
        quoted = {a for a, quoting in found.hubs.items() if prompts.intersection(quoting)}
        out.append([found.root[k] in clusters or k in quoted for k in asked])
    return out
