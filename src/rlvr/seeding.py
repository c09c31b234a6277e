"""Seeds derived from coordinates, never from global state.

Every random draw in rlvr takes a seed computed from ``(run seed, coordinates...)`` with a stable
hash (blake2b), so a draw is reproducible on its own: resuming at step 17 draws exactly what an
uninterrupted run drew at step 17, with nothing to save but the run seed.
Python's ``hash()`` is never used: it is salted per process.
"""

from __future__ import annotations

import hashlib
import random
from pathlib import Path


def derive_seed(seed: int, *coords: object) -> int:
    """A 63-bit seed for the draw at ``coords`` of the run seeded with ``seed``."""
    text = "\x1f".join([str(seed), *(repr(c) for c in coords)])
    digest = hashlib.blake2b(text.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") >> 1


def rng_for(seed: int, *coords: object) -> random.Random:
    """A private ``random.Random`` for the draw at ``coords``."""
    return random.Random(derive_seed(seed, *coords))


def stable_hash(text: str, salt: str = "") -> str:
    """Hex sha256 of ``salt + text``; the content hash used for splits and manifests."""
    return hashlib.sha256((salt + text).encode()).hexdigest()


def file_sha256(path: str | Path) -> str:
    """Hex sha256 of a file's bytes, read in 1 MiB blocks: checkpoint manifests, base fingerprints and
    GGUF files all hash files this way."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
