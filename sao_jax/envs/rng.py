"""A random stream that gives the same numbers on every machine, process and Python version.

Tasks must be a pure function of their split and index (ALFWorld games: and size). Python's
`hash()` is salted per process and `random.Random`'s helpers (`randrange`, `shuffle`, `sample`)
may change between Python versions; only `Random.random()` under an integer seed is guaranteed
stable. So seeds come from BLAKE2b and every draw is derived from `random()` alone.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Sequence
from typing import TypeVar

T = TypeVar("T")


def stable_seed(*parts: object) -> int:
    """64-bit seed from the `str` of each part, identical across processes and machines."""
    text = "\x1f".join(str(part) for part in parts)
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little")


class StableRng:
    """Deterministic draws built only on `random.Random.random()`."""

    def __init__(self, *seed_parts: object):
        self._random = random.Random(stable_seed(*seed_parts)).random

    def below(self, n: int) -> int:
        """Uniform integer in [0, n)."""
        if n <= 0:
            raise ValueError(f"below(n) needs n > 0, got {n}")
        return min(int(self._random() * n), n - 1)

    def chance(self, p: float) -> bool:
        """True with probability p (a Bernoulli draw; p outside [0, 1] is never / always)."""
        return self._random() < p

    def between(self, low: int, high: int) -> int:
        """Uniform integer in [low, high] (both ends included)."""
        return low + self.below(high - low + 1)

    def choice(self, items: Sequence[T]) -> T:
        """One element of a non-empty sequence."""
        if not items:
            raise ValueError("choice() from an empty sequence")
        return items[self.below(len(items))]

    def shuffled(self, items: Sequence[T]) -> list[T]:
        """A new list with the items in a uniformly random order (Fisher-Yates)."""
        out = list(items)
        for i in range(len(out) - 1, 0, -1):
            j = self.below(i + 1)
            out[i], out[j] = out[j], out[i]
        return out

    def sample(self, items: Sequence[T], k: int) -> list[T]:
        """k distinct elements, in random order."""
        if k > len(items):
            raise ValueError(f"sample of {k} from {len(items)} items")
        return self.shuffled(items)[:k]
