"""Top-k log-probs of freshly generated tokens, for OpenAI's `top_logprobs`.

The sampler records the log-prob of each sampled token only. For requests that ask for the
alternatives, the worker re-reads the chunk it just generated in one teacher-forced forward
pass over the slots' KV caches (like a speculative-decoding verify step): row r feeds the
tokens that preceded its new tokens at their cache positions, so logits at step j predict new
token j exactly as decoding did. The pass reads the cache and discards what it writes.
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from sao_jax.rollout import DecodeState, Sampler, bucket

TOP_K_MAX = 20  # OpenAI's limit for top_logprobs


class TopLogprobScorer:
    """`scorer(state, rows) -> [(ids [n, k], logprobs [n, k]) per row]`, one jitted pass."""

    def __init__(self, sampler: Sampler, min_width: int = 8):
        self.sampler = sampler
        self.min_width = min_width
        self._jitted = jax.jit(self._score)

    def _score(self, params, cache, slots, tokens, positions, valid):
        model = nnx.merge(self.sampler.graphdef, params)
        sub = cache.take_slots(slots)
        out = model.forward(
            tokens, positions=positions, segment_ids=valid.astype(jnp.int32), kv_cache=sub.layers()
        )
        logp = jax.nn.log_softmax(model.logits(out.hidden), axis=-1)
        values, ids = jax.lax.top_k(logp, TOP_K_MAX)
        return ids.astype(jnp.int32), values

    def __call__(
        self, state: DecodeState, rows: Sequence[tuple[int, Sequence[int], int]]
    ) -> list[tuple[np.ndarray, np.ndarray]]:
        """rows: (slot, context tokens [n] that precede each new token, position of the first).

        Returns per row the top TOP_K_MAX (ids [n, K], log-probs [n, K]) at temperature 1.
        """
        n_rows = bucket(len(rows), 1)
        width = bucket(max(len(tokens) for _, tokens, _ in rows), self.min_width)
        tokens = np.zeros((n_rows, width), np.int32)
        positions = np.zeros((n_rows, width), np.int32)
        valid = np.zeros((n_rows, width), bool)
        slots = np.zeros((n_rows,), np.int32)
        for r, (slot, context, start) in enumerate(rows):
            n = len(context)
            tokens[r, :n] = context
            positions[r, :n] = np.arange(start, start + n)
            valid[r, :n] = True
            slots[r] = slot
        ids, values = self._call(state, slots, tokens, positions, valid)
        ids, values = np.asarray(ids), np.asarray(values)
        return [(ids[r, : len(c)], values[r, : len(c)]) for r, (_, c, _) in enumerate(rows)]

    def _call(self, state, *arrays):
        args = (self.sampler.params, state.cache, *arrays)
        if self.sampler.mesh is None:
            return self._jitted(*args)
        with jax.set_mesh(self.sampler.mesh):
            return self._jitted(*args)
