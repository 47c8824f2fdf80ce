"""Log-probs under a decoding transform (a grammar mask, temperature, top-k, top-p),
differentiable.

The sampler draws each token from a transformed distribution and records its log-prob there
(`sao_jax.rollout.sampling.behaviour_logprob`); the learner's DIS ratio `pi_theta(a) / mu(a)`
is only 1 at the sampling weights when `pi_theta` goes through the same transform. This module
is that transform for the learner: pure jax, below both `rollout` and `train` (no cycle).

Semantics match `sao_jax.rollout.sampling.sample_tokens` on the sampler's masked logits:
disallowed ids at -inf (constrained decoding's token mask), logits / temperature, then top-k,
then top-p (smallest prefix of the sorted kept mass reaching top_p, HF order), renormalised.
The kept set is piecewise constant in the weights, so the gradient flows through the softmax
over the kept set only. Two cases have no density and get a constant (zero gradient):
- a token outside the kept set at the current weights: `LOGP_FLOOR` (its DIS ratio is 0, so
  the token is dropped; a finite floor keeps 0 * floor = 0 in the loss, never NaN);
- temperature 0 (greedy): a point mass, 0 when the token is still the argmax (ratio 1, no
  gradient: nothing to learn from a deterministic choice), else `LOGP_FLOOR`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from sao_jax.models.logprobs import LOGPROB_CHUNK

LOGP_FLOOR = -1.0e4


def sorted_top_k_top_p(
    scaled: jax.Array, top_k: jax.Array, top_p: jax.Array
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """The top-k then top-p rule (HF order) on scaled logits [N, V], top_k [N] int (0: off),
    top_p [N] (1.0: off), in descending-logit order: (order [N, V] the vocabulary ids by rank,
    keep [N, V] bool, probs [N, V] the softmax over the top-k set). top-p keeps the smallest
    prefix whose mass reaches top_p. The one definition the sampler and the learner share."""
    vocab = scaled.shape[-1]
    order = jnp.argsort(-scaled, axis=-1)
    sorted_logits = jnp.take_along_axis(scaled, order, axis=-1)
    rank = jnp.arange(vocab)[None, :]
    keep = (top_k[:, None] <= 0) | (rank < top_k[:, None])
    probs = jax.nn.softmax(jnp.where(keep, sorted_logits, -jnp.inf), axis=-1)
    mass_before = jnp.cumsum(probs, axis=-1) - probs
    return order, keep & (mass_before < top_p[:, None]), probs


def to_vocabulary_order(sorted_values: jax.Array, order: jax.Array) -> jax.Array:
    """[N, V] values in rank order (`sorted_top_k_top_p`'s order) back in vocabulary order."""
    rows = jnp.arange(order.shape[0])[:, None]
    return jnp.zeros_like(sorted_values).at[rows, order].set(sorted_values)


def keep_mask(scaled: jax.Array, top_k: jax.Array, top_p: jax.Array) -> jax.Array:
    """[N, V] bool, in vocabulary order: the ids top-k then top-p keep for scaled logits [N, V]
    (`sorted_top_k_top_p`, the sampler's rule)."""
    order, keep, _ = sorted_top_k_top_p(scaled, top_k, top_p)
    return to_vocabulary_order(keep, order)


def mask_bits(words: jax.Array, vocab: int) -> jax.Array:
    """Bitmasks [..., W] int32 (bit i % 32 of word i // 32: id i allowed; the sampler's layout)
    -> [..., vocab] bool."""
    bits = (words[..., None] >> jnp.arange(32, dtype=words.dtype)) & 1
    return bits.reshape(*words.shape[:-1], -1)[..., :vocab].astype(bool)


def transformed_logprob(
    logits: jax.Array,
    tokens: jax.Array,
    temperature: jax.Array,
    top_k: jax.Array,
    top_p: jax.Array,
    allowed: jax.Array | None = None,
) -> jax.Array:
    """log-prob of `tokens` [N] under the transformed distribution of `logits` [N, V] (float32,
    temperature 1); temperature / top_p [N] float, top_k [N] int; `allowed` [N, V] bool: the
    ids a grammar mask left (the others go to -inf first, as in the sampler; None: all).
    Returns [N] float32, differentiable w.r.t. `logits` (see the module docstring for the
    greedy and out-of-set constants)."""
    logits = logits.astype(jnp.float32)
    if allowed is not None:
        logits = jnp.where(allowed, logits, -jnp.inf)
    greedy = temperature <= 0
    scaled = logits / jnp.where(greedy, 1.0, temperature)[:, None]
    # the sort is not differentiable and only decides membership
    keep = keep_mask(jax.lax.stop_gradient(scaled), top_k, top_p)
    kept = jnp.where(keep, scaled, -jnp.inf)
    log_z = jax.nn.logsumexp(kept, axis=-1)
    chosen = jnp.take_along_axis(scaled, tokens[:, None], axis=-1)[:, 0]
    inside = jnp.take_along_axis(keep, tokens[:, None], axis=-1)[:, 0]
    logp = jnp.where(inside, chosen - log_z, LOGP_FLOOR)
    top = jnp.max(logits, axis=-1)
    is_argmax = jnp.take_along_axis(logits, tokens[:, None], axis=-1)[:, 0] >= top
    greedy_logp = jnp.where(is_argmax, 0.0, LOGP_FLOOR)
    return jnp.where(greedy, jax.lax.stop_gradient(greedy_logp), logp)


def chunked_transformed_logprobs(
    hidden: jax.Array,
    unembedding: jax.Array,
    targets: jax.Array,
    temperature: jax.Array,
    top_k: jax.Array,
    top_p: jax.Array,
    *,
    mask_index: jax.Array | None = None,
    mask_table: jax.Array | None = None,
    chunk_size: int = LOGPROB_CHUNK,
) -> jax.Array:
    """`transformed_logprob` from hidden states [B, K, D] and unembedding [D, V] for targets
    and transforms [B, K]: [B, K] float32. Chunked over K with rematerialisation, so one
    [B, chunk, V] logits block (plus its sort and mask) lives at a time, forward and backward.

    Token masks: `mask_table` [M, W] int32 bitmasks and `mask_index` [B, K] int32, each
    target's mask in the table (-1: unmasked); the [B, chunk, V] bits are unpacked inside the
    chunk, never for all K at once."""
    b, k, _ = hidden.shape
    masked = mask_table is not None
    if not masked:
        mask_index = jnp.full((b, k), -1, jnp.int32)
    chunk = min(chunk_size, k)
    pad = (-k) % chunk
    n = (k + pad) // chunk

    def split(x: jax.Array, fill) -> jax.Array:
        widths = ((0, 0), (0, pad)) + ((0, 0),) * (x.ndim - 2)
        x = jnp.pad(x, widths, constant_values=fill)
        return x.reshape(b, n, chunk, *x.shape[2:]).swapaxes(0, 1)

    w = unembedding.astype(hidden.dtype)

    @jax.checkpoint
    def one_chunk(h, t, temp, kk, pp, mi):
        logits = jnp.einsum("bcd,dv->bcv", h, w, preferred_element_type=jnp.float32)
        allowed = None
        if masked:
            words = mask_table[jnp.maximum(mi, 0)]
            allowed = mask_bits(words, logits.shape[-1]) | (mi < 0)[..., None]
        flat = lambda x: None if x is None else x.reshape(b * chunk, *x.shape[2:])  # noqa: E731
        out = transformed_logprob(
            flat(logits), flat(t), flat(temp), flat(kk), flat(pp), flat(allowed)
        )
        return out.reshape(b, chunk)

    args = (
        split(hidden, 0),
        split(targets, 0),
        split(temperature, 1.0),
        split(top_k, 0),
        split(top_p, 1.0),
        split(mask_index, -1),
    )
    logp = jax.lax.map(lambda a: one_chunk(*a), args)
    return logp.swapaxes(0, 1).reshape(b, n * chunk)[:, :k]
