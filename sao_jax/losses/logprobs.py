"""Per-token log-probabilities of given tokens from full logits.

This version takes materialised logits [B, T, V]; the model package has a chunked version that
starts from hidden states and never holds the whole [B, T, V] array.
"""

import chex
import jax
import jax.numpy as jnp

from sao_jax.losses.masked import check_hyperparameter


def token_logprobs(logits: jax.Array, tokens: jax.Array, temperature: float = 1.0) -> jax.Array:
    """`log_softmax(logits / temperature)` gathered at `tokens`.

    Computed as `logits[token] / temperature - logsumexp(logits / temperature)` in float32, so
    no normalised [B, T, V] array is written out and bf16 logits lose nothing in the reduction.

    Args:
      logits: [B, T, V] any float dtype; `logits[b, t]` scores the token at position t.
      tokens: [B, T] integer ids. Ids >= V give NaN (mask those positions out); negative ids
        index from the end, as in NumPy.
      temperature: > 0. Use 1.0 to match the sampler's recorded `rollout_logp`.

    Returns:
      [B, T] float32 log-probabilities.
    """
    logits = jnp.asarray(logits)
    tokens = jnp.asarray(tokens)
    chex.assert_rank(logits, 3, custom_message="token_logprobs: logits must be [B, T, V]")
    chex.assert_rank(tokens, 2, custom_message="token_logprobs: tokens must be [B, T]")
    if logits.shape[:2] != tokens.shape:
        raise ValueError(
            f"token_logprobs: logits {logits.shape} and tokens {tokens.shape} disagree on [B, T]"
        )
    if not jnp.issubdtype(tokens.dtype, jnp.integer):
        raise ValueError(f"token_logprobs: tokens must be integer ids, got dtype {tokens.dtype}")
    check_hyperparameter(
        "token_logprobs", "temperature", temperature, minimum=0.0, strict_minimum=True
    )
    scaled = logits.astype(jnp.float32) / temperature
    picked = jnp.take_along_axis(scaled, tokens[..., None], axis=-1)[..., 0]
    return picked - jax.nn.logsumexp(scaled, axis=-1)
