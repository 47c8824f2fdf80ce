"""Token selection from logits: greedy, temperature, top-k and top-p, per row.

All decoding parameters are per-row arrays, not Python constants, so changing them (or mixing
requests with different settings in one batch) never recompiles.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from sao_jax.models.decoding import sorted_top_k_top_p, to_vocabulary_order


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


def greedy_tokens(logits: jax.Array) -> jax.Array:
    """argmax over the last axis (first maximum), [B, V] -> [B] int32.

    Two plain reductions: XLA:CPU's variadic-reduce argmax is ~4x slower at vocabulary sizes.
    """
    top = jnp.max(logits, axis=-1, keepdims=True)
    vocab = logits.shape[-1]
    index = jnp.min(jnp.where(logits == top, jnp.arange(vocab), vocab), axis=-1)
    return jnp.minimum(index, vocab - 1).astype(jnp.int32)  # all-NaN rows: last id, not V


def _inverse_cdf(probs: jax.Array, keys: jax.Array) -> jax.Array:
    """One draw per row from unnormalised probs [B, V]: a single uniform per row.

    Far cheaper on CPU than Gumbel-max, which needs V random numbers per row and step.
    """
    u = 1.0 - jax.vmap(jax.random.uniform)(keys)  # (0, 1]: a zero-probability token never wins
    cdf = jnp.cumsum(probs, axis=-1)
    index = jnp.sum(cdf < (u * cdf[:, -1])[:, None], axis=-1)
    return jnp.minimum(index, probs.shape[-1] - 1)


def _filtered_probs(scaled: jax.Array, top_k: jax.Array, top_p: jax.Array) -> jax.Array:
    """Top-k then top-p (HF order) -> the kept probs [B, V], in vocabulary order.

    The filter runs on sorted logits; the result goes back to vocabulary order so that every
    row draws from a CDF in the same order whether or not it (or a neighbour) filters.
    """
    order, keep, probs = sorted_top_k_top_p(scaled, top_k, top_p)
    return to_vocabulary_order(jnp.where(keep, probs, 0.0), order)


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

    def sample(scaled: jax.Array) -> jax.Array:
        # A row that does not filter draws from its plain softmax whatever its neighbours do
        # (batch invariance), and the full-vocabulary sort runs only when some row filters.
        plain = jax.nn.softmax(scaled, axis=-1)
        filters = (top_k > 0) | (top_p < 1.0)

        def filtered(scaled: jax.Array) -> jax.Array:
            return jnp.where(filters[:, None], _filtered_probs(scaled, top_k, top_p), plain)

        probs = jax.lax.cond(jnp.any(filters), filtered, lambda s: plain, scaled)
        return _inverse_cdf(probs, keys)

    argmax = greedy_tokens(logits)
    sampled = jax.lax.cond(
        jnp.all(greedy), lambda s: argmax, lambda s: sample(s).astype(jnp.int32), scaled
    )
    return jnp.where(greedy, argmax, sampled)


def token_logprob(logits: jax.Array, tokens: jax.Array) -> jax.Array:
    """log softmax(logits)[token] per row, at temperature 1: [B, V], [B] -> [B] float32."""
    log_probs = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
    return jnp.take_along_axis(log_probs, tokens[:, None], axis=-1)[:, 0]


def allowed_tokens(token_mask: jax.Array, vocab: int) -> jax.Array:
    """Bitmask [B, ceil(V / 32)] int32 (bit i % 32 of word i // 32) -> allowed [B, V] bool.
    A row that allows nothing allows everything (never an all -inf row)."""
    ids = jnp.arange(vocab)
    allowed = ((token_mask[:, ids // 32] >> (ids % 32)) & 1).astype(bool)
    return allowed | ~jnp.any(allowed, axis=-1, keepdims=True)


def behaviour_logprob(
    logits: jax.Array,
    tokens: jax.Array,
    temperature: jax.Array,
    top_k: jax.Array,
    top_p: jax.Array,
) -> jax.Array:
    """log-prob of `tokens` [B] under the distribution `sample_tokens` draws them from, for
    the same logits [B, V] (already masked: disallowed ids at -inf), temperature, top-k and
    top-p. Greedy rows: 0 (the argmax has all the mass)."""
    greedy = temperature <= 0
    scaled = logits / jnp.where(greedy, 1.0, temperature)[:, None]
    filters = (top_k > 0) | (top_p < 1.0)
    plain = jax.nn.softmax(scaled, axis=-1)

    def filtered(scaled: jax.Array) -> jax.Array:
        return jnp.where(filters[:, None], _filtered_probs(scaled, top_k, top_p), plain)

    probs = jax.lax.cond(jnp.any(filters), filtered, lambda s: plain, scaled)
    chosen = jnp.take_along_axis(probs, tokens[:, None], axis=-1)[:, 0]
    logp = jnp.log(chosen) - jnp.log(jnp.sum(probs, axis=-1))
    return jnp.where(greedy, 0.0, logp)
