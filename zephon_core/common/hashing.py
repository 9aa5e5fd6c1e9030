"""Seed derivation from data identity.

Every random choice in zephon is a pure function of the seed and *what* is being
decided (dataset, epoch, shard, lane, element), never of a global counter whose
value would depend on grouping, worker counts or timing.
"""

from __future__ import annotations

import numpy as np

_MASK = (1 << 64) - 1


def _splitmix64(x: int) -> int:
    x = (x + 0x9E3779B97F4A7C15) & _MASK
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK
    return x ^ (x >> 31)


def derive(*parts: int) -> int:
    """A 64-bit key from a tuple of integers; stable across processes and versions."""
    return derive_from(0x6A09E667F3BCC908, *parts)


def derive_from(h: int, *parts: int) -> int:
    """Continue a key: ``derive(*a, *b) == derive_from(derive(*a), *b)``, so a caller that
    derives many keys with the same first parts hashes those once."""
    for p in parts:
        h = _splitmix64(h ^ (int(p) & _MASK))
    return h


def rng(*parts: int) -> np.random.Generator:
    """A numpy generator seeded by `derive(*parts)`."""
    return np.random.Generator(np.random.PCG64(derive(*parts)))


def uniform_index(n: int, *parts: int) -> int:
    """An index in [0, n) drawn from the key of `parts` (n small: modulo bias is negligible)."""
    return derive(*parts) % n
