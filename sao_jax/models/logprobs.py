"""Per-token log-probs and entropies from hidden states, without [B, T, V] logits in memory.

Large vocabularies (Qwen3: 151,936) make the full logits tensor the biggest activation of a
training step. Here the sequence is cut into chunks; each chunk's logits live only inside a
rematerialised scan step, so both the forward and the backward pass hold one [B, chunk, V]
block at a time.

An objective that needs log-probs at a few positions only (an RL loss reads the action tokens,
a few percent of a batch) gathers those positions first (`take_positions`), runs the head on
them and puts the results back in place (`scatter_positions`).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

# Positions per chunk of the LM head: bounds the [B, chunk, V] logits alive at once. The default
# of every log-prob path (model, decoding, learner, warm start, memory plan).
LOGPROB_CHUNK = 256


def _chunks(hidden: jax.Array, chunk_size: int, *others: jax.Array):
    """[B, T, ...] arrays -> [n, B, chunk, ...] blocks over T (zero-padded) and an unchunker."""
    b, t = hidden.shape[:2]
    chunk = min(chunk_size, t)
    pad = (-t) % chunk
    n = (t + pad) // chunk

    def split(x):
        x = jnp.pad(x, ((0, 0), (0, pad), *[(0, 0)] * (x.ndim - 2)))
        return x.reshape(b, n, chunk, *x.shape[2:]).swapaxes(0, 1)

    def unchunk(x):
        return x.swapaxes(0, 1).reshape(b, n * chunk, *x.shape[3:])[:, :t]

    return (split(hidden), *(split(x) for x in others)), unchunk


def _check_head(hidden: jax.Array, unembedding: jax.Array, chunk_size: int) -> None:
    if hidden.ndim != 3:
        raise ValueError(f"hidden must be [B, T, D], got {hidden.shape}")
    if unembedding.shape[0] != hidden.shape[-1]:
        raise ValueError(f"unembedding must be [D={hidden.shape[-1]}, V], got {unembedding.shape}")
    if chunk_size <= 0:
        raise ValueError(f"chunk_size must be positive, got {chunk_size}")


def chunked_token_logprobs(
    hidden: jax.Array,
    unembedding: jax.Array,
    targets: jax.Array,
    *,
    chunk_size: int = LOGPROB_CHUNK,
    temperature: float = 1.0,
) -> tuple[jax.Array, jax.Array]:
    """Log-prob of each target token and the entropy of each predictive distribution.

    Args:
      hidden: [B, T, D] final hidden states (after the final norm).
      unembedding: [D, V] output projection.
      targets: [B, T] int token ids whose log-probs are wanted (usually inputs shifted left).
      chunk_size: positions per chunk; peak logits memory is B * chunk_size * V floats.
      temperature: logits are divided by it (1.0: the policy's own distribution).
    Returns:
      (logp [B, T] float32, entropy [B, T] float32); differentiable w.r.t. hidden and
      unembedding.
    """
    if hidden.ndim != 3 or targets.shape != hidden.shape[:2]:
        raise ValueError(
            f"hidden must be [B, T, D] and targets [B, T]; got {hidden.shape} and {targets.shape}"
        )
    _check_head(hidden, unembedding, chunk_size)
    if temperature <= 0:
        raise ValueError(f"temperature must be positive, got {temperature}")
    (h, tg), unchunk = _chunks(hidden, chunk_size, targets)
    w = unembedding.astype(hidden.dtype)

    @jax.checkpoint
    def one_chunk(h_c: jax.Array, t_c: jax.Array) -> tuple[jax.Array, jax.Array]:
        logits = jnp.einsum("bcd,dv->bcv", h_c, w, preferred_element_type=jnp.float32)
        logits = logits / temperature
        log_z = jax.nn.logsumexp(logits, axis=-1)
        logp = jnp.take_along_axis(logits, t_c[..., None], axis=-1)[..., 0] - log_z
        probs = jnp.exp(logits - log_z[..., None])
        entropy = log_z - jnp.sum(probs * logits, axis=-1)
        return logp, entropy

    logp, entropy = jax.lax.map(lambda args: one_chunk(*args), (h, tg))
    return unchunk(logp), unchunk(entropy)


def chunked_top_logprobs(
    hidden: jax.Array,
    unembedding: jax.Array,
    k: int,
    *,
    chunk_size: int = LOGPROB_CHUNK,
) -> tuple[jax.Array, jax.Array]:
    """The k most likely next tokens at each position and their log-probs (temperature 1).

    Args:
      hidden: [B, T, D] final hidden states; unembedding: [D, V]; k: 1 <= k <= V.
      chunk_size: positions per chunk (peak logits memory B * chunk_size * V floats).
    Returns:
      (ids [B, T, k] int32, logp [B, T, k] float32), most likely first; no gradient (a
      teacher's distribution, `sao_jax.losses.seed_distribution_loss`).
    """
    _check_head(hidden, unembedding, chunk_size)
    vocab = unembedding.shape[-1]
    if not 1 <= k <= vocab:
        raise ValueError(f"k must be in [1, V={vocab}], got {k}")
    (h,), unchunk = _chunks(jax.lax.stop_gradient(hidden), chunk_size)
    w = jax.lax.stop_gradient(unembedding).astype(hidden.dtype)

    def one_chunk(h_c: jax.Array) -> tuple[jax.Array, jax.Array]:
        logits = jnp.einsum("bcd,dv->bcv", h_c, w, preferred_element_type=jnp.float32)
        top, ids = jax.lax.top_k(logits, k)
        return ids.astype(jnp.int32), top - jax.nn.logsumexp(logits, axis=-1, keepdims=True)

    ids, logp = jax.lax.map(one_chunk, h)
    return unchunk(ids), unchunk(logp)


def chunked_candidate_logprobs(
    hidden: jax.Array,
    unembedding: jax.Array,
    candidates: jax.Array,
    *,
    chunk_size: int = LOGPROB_CHUNK,
) -> jax.Array:
    """Log-probs of K candidate tokens at each position, normalised over the whole vocabulary.

    Args:
      hidden: [B, T, D] final hidden states; unembedding: [D, V].
      candidates: [B, T, K] int token ids (e.g. a teacher's top-k, `chunked_top_logprobs`).
      chunk_size: positions per chunk; each chunk's logits are rematerialised in the backward.
    Returns:
      logp [B, T, K] float32, differentiable w.r.t. hidden and unembedding.
    """
    _check_head(hidden, unembedding, chunk_size)
    if candidates.ndim != 3 or candidates.shape[:2] != hidden.shape[:2]:
        raise ValueError(
            f"candidates must be [B, T, K] with [B, T] = {hidden.shape[:2]}, got {candidates.shape}"
        )
    (h, c), unchunk = _chunks(hidden, chunk_size, candidates)
    w = unembedding.astype(hidden.dtype)

    @jax.checkpoint
    def one_chunk(h_c: jax.Array, c_c: jax.Array) -> jax.Array:
        logits = jnp.einsum("bcd,dv->bcv", h_c, w, preferred_element_type=jnp.float32)
        log_z = jax.nn.logsumexp(logits, axis=-1, keepdims=True)
        return jnp.take_along_axis(logits, c_c, axis=-1) - log_z

    return unchunk(jax.lax.map(lambda args: one_chunk(*args), (h, c)))


def token_logprobs_from_logits(
    logits: jax.Array, targets: jax.Array, temperature: float = 1.0
) -> tuple[jax.Array, jax.Array]:
    """Reference (unchunked) version: logits [B, T, V], targets [B, T] -> (logp, entropy)."""
    logits = logits.astype(jnp.float32) / temperature
    log_probs = jax.nn.log_softmax(logits, axis=-1)
    logp = jnp.take_along_axis(log_probs, targets[..., None], axis=-1)[..., 0]
    entropy = -jnp.sum(jnp.exp(log_probs) * log_probs, axis=-1)
    return logp, entropy


def take_positions(x: jax.Array, index: jax.Array) -> jax.Array:
    """Row-wise gather: x [B, T, ...], index [B, K] int -> [B, K, ...], out[b, k] = x[b, index[b, k]].

    Rows stay rows, so a batch sharded over B gathers without any communication; the gradient
    is the matching scatter-add.
    """
    if index.ndim != 2 or index.shape[0] != x.shape[0]:
        raise ValueError(f"index must be [B={x.shape[0]}, K], got {index.shape}")
    return jax.vmap(lambda row, i: row[i])(x, index)


def scatter_positions(
    values: jax.Array, index: jax.Array, valid: jax.Array, length: int
) -> jax.Array:
    """The inverse of `take_positions` for distinct valid columns: values [B, K] -> [B, length].

    out[b, index[b, k]] = values[b, k] where valid[b, k]; every other entry is 0 (invalid
    entries, wherever their index points, add exactly 0 and get a zero gradient).
    """
    if not values.shape == index.shape == valid.shape:
        raise ValueError(
            f"values, index and valid must share [B, K]: {values.shape}, {index.shape}, "
            f"{valid.shape}"
        )
    kept = jnp.where(valid, values, jnp.zeros((), values.dtype))
    return jax.vmap(lambda v, i: jnp.zeros((length,), v.dtype).at[i].add(v))(kept, index)
