"""Token selection from logits: greedy, temperature, top-k and top-p, per row.

All decoding parameters are per-row arrays, not Python constants, so changing them (or mixing
requests with different settings in one batch) never recompiles.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp


@dataclasses.dataclass(frozen=True)
class SamplingParams:
    """Decoding settings of one request.

    temperature: 0 means greedy (argmax). top_k: 0 disables it. top_p: 1.0 disables it.
    max_new_tokens: cap on generated tokens (the stop token counts). stop_token_ids: generation
    ends after emitting one of them. seed: per-request RNG seed (same seed, same weights and
    prompt -> same tokens, whatever else is in the batch).
    """

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    max_new_tokens: int = 128
    stop_token_ids: tuple[int, ...] = ()
    seed: int = 0

    def __post_init__(self):
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0 (0 disables), got {self.top_k}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")


def _filtered_sample(
    scaled: jax.Array, keys: jax.Array, top_k: jax.Array, top_p: jax.Array
) -> jax.Array:
    """Sample after top-k then top-p filtering (HF order: temperature, top-k, top-p)."""
    vocab = scaled.shape[-1]
    order = jnp.argsort(-scaled, axis=-1)
    sorted_logits = jnp.take_along_axis(scaled, order, axis=-1)
    rank = jnp.arange(vocab)[None, :]
    keep = (top_k[:, None] <= 0) | (rank < top_k[:, None])
    masked = jnp.where(keep, sorted_logits, -jnp.inf)
    probs = jax.nn.softmax(masked, axis=-1)
    mass_before = jnp.cumsum(probs, axis=-1) - probs
    keep = keep & (mass_before < top_p[:, None])  # smallest prefix with mass >= top_p
    masked = jnp.where(keep, sorted_logits, -jnp.inf)
    choice = jax.vmap(jax.random.categorical)(keys, masked)
    return jnp.take_along_axis(order, choice[:, None], axis=-1)[:, 0]


def sample_tokens(
    logits: jax.Array,
    keys: jax.Array,
    temperature: jax.Array,
    top_k: jax.Array,
    top_p: jax.Array,
) -> jax.Array:
    """Pick one token per row.

    Args:
      logits: [B, V] float32 (temperature 1).
      keys: [B] typed PRNG keys, one per row.
      temperature: [B] (0: greedy); top_k: [B] int (0: off); top_p: [B] (1.0: off).
    Returns:
      [B] int32 token ids.
    """
    greedy = temperature <= 0
    scaled = logits / jnp.where(greedy, 1.0, temperature)[:, None]
    needs_filter = jnp.any((top_k > 0) | (top_p < 1.0))
    # The full-vocabulary sort is skipped (lax.cond) unless some row filters.
    sampled = jax.lax.cond(
        needs_filter,
        lambda s: _filtered_sample(s, keys, top_k, top_p),
        lambda s: jax.vmap(jax.random.categorical)(keys, s),
        scaled,
    )
    return jnp.where(greedy, jnp.argmax(logits, axis=-1), sampled).astype(jnp.int32)


def token_logprob(logits: jax.Array, tokens: jax.Array) -> jax.Array:
    """log softmax(logits)[token] per row, at temperature 1: [B, V], [B] -> [B] float32."""
    log_probs = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
    return jnp.take_along_axis(log_probs, tokens[:, None], axis=-1)[:, 0]
