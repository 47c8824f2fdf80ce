"""Which tokens each KV-cache slot still holds, so a new request can reuse a slot's prefix.

A finished request leaves its keys and values in its slot until another request overwrites
them. An agent re-sends its whole conversation every turn (system prompt, tool schemas,
history: tens of thousands of tokens), so the slot that served the previous turn already holds
all but the newest messages. `SlotContents` records, per slot, the token ids whose KV sits at
cache positions 0..n-1 (and under which weights); `choose` places a request in the free slot
sharing the longest prefix with its prompt (any earlier request's, of any session), else in
the least recently used free slot, so recent prefixes survive longest (LRU over the slots; the
memory bound is the cache itself: no copies are kept).

Bookkeeping only: the engine calls `prefilled` / `decoded` after each sampler call with the
tokens the sampler wrote (a prefill writes every prompt token; a decode step writes the token
sampled before it, so the newest sampled token is never in the cache yet).
"""

from __future__ import annotations

import dataclasses
import time

import numpy as np


def common_prefix(a: np.ndarray, b: np.ndarray) -> int:
    """Length of the longest common prefix of two 1-D int arrays."""
    n = min(len(a), len(b))
    if n == 0:
        return 0
    differ = np.flatnonzero(a[:n] != b[:n])
    return int(differ[0]) if len(differ) else n


@dataclasses.dataclass
class _Resident:
    tokens: list[int] = dataclasses.field(default_factory=list)  # at positions 0..n-1
    pending: int | None = None  # sampled, not yet written (fed at the next decode step)
    generation: int = -1  # `Sampler.weights_generation` the keys and values were computed by
    last_used: float = 0.0
    _array: np.ndarray | None = None

    def array(self) -> np.ndarray:
        if self._array is None or len(self._array) != len(self.tokens):
            self._array = np.asarray(self.tokens, np.int32)
        return self._array


class SlotContents:
    """Per slot: the token ids cached at its positions 0..n-1 (see the module docstring)."""

    def __init__(self, num_slots: int, enabled: bool = True):
        self.enabled = enabled
        self._slots = [_Resident() for _ in range(num_slots)]

    def cached(self, slot: int, prompt: np.ndarray, generation: int) -> int:
        """Leading prompt tokens slot `slot` holds under weights `generation`; the prompt's
        last token is always left to encode (its logits give the first sample)."""
        resident = self._slots[slot]
        if not self.enabled or resident.generation != generation or not resident.tokens:
            return 0
        return min(common_prefix(resident.array(), prompt), len(prompt) - 1)

    def choose(self, prompt: np.ndarray, free: list[int], generation: int) -> tuple[int, int]:
        """(slot, cached tokens): the free slot with the longest reusable prefix of `prompt`;
        without one, the least recently used free slot (empty slots first)."""
        best, best_cached = None, 0
        for slot in free:
            cached = self.cached(slot, prompt, generation)
            if cached > best_cached:
                best, best_cached = slot, cached
        if best is None:
            best = min(free, key=lambda s: (bool(self._slots[s].tokens), self._slots[s].last_used))
        return best, best_cached

    def prefilled(self, slot: int, prompt: list[int], first: int, generation: int) -> None:
        """A prefill wrote `prompt` at positions 0.. of `slot` and sampled `first`."""
        self._slots[slot] = _Resident(list(prompt), int(first), generation, time.monotonic())

    def chunk_prefilled(self, slot: int, prompt: list[int], generation: int) -> None:
        """A prefill chunk wrote `prompt` at positions 0..; its sample is discarded."""
        self._slots[slot] = _Resident(list(prompt), None, generation, time.monotonic())

    def decoded(self, slot: int, tokens: list[int]) -> None:
        """A decode dispatch sampled `tokens` in `slot` (the pending token and all but the
        last of them were written)."""
        if not tokens:
            return
        resident = self._slots[slot]
        if resident.pending is not None:
            resident.tokens.append(resident.pending)
        resident.tokens.extend(tokens[:-1])
        resident.pending = tokens[-1]
        resident.last_used = time.monotonic()

    def clear(self) -> None:
        """Forget every slot's contents (the cache was rebuilt)."""
        self._slots = [_Resident() for _ in self._slots]

    def tokens(self, slot: int) -> list[int]:
        """The token ids at positions 0.. of `slot` (a copy)."""
        return list(self._slots[slot].tokens)
