"""Chunked token log-probs / entropy equal the naive full-logits version, values and grads,
without holding [B, T, V] logits."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sao_jax.models import (
    chunked_candidate_logprobs,
    chunked_token_logprobs,
    chunked_top_logprobs,
    token_logprobs_from_logits,
)


def _inputs(b=2, t=37, d=16, v=50, seed=0):
    k1, k2, k3 = jax.random.split(jax.random.key(seed), 3)
    hidden = jax.random.normal(k1, (b, t, d))
    unembed = jax.random.normal(k2, (d, v)) * 0.5
    targets = jax.random.randint(k3, (b, t), 0, v)
    return hidden, unembed, targets


def _naive(hidden, unembed, targets, temperature=1.0):
    return token_logprobs_from_logits(hidden @ unembed, targets, temperature)


@pytest.mark.parametrize("chunk_size", [5, 37, 64])  # 5 does not divide T=37; 64 > T
def test_chunked_equals_naive(chunk_size):
    hidden, unembed, targets = _inputs()
    logp, entropy = chunked_token_logprobs(hidden, unembed, targets, chunk_size=chunk_size)
    ref_logp, ref_entropy = _naive(hidden, unembed, targets)
    assert logp.shape == entropy.shape == targets.shape
    np.testing.assert_allclose(logp, ref_logp, atol=1e-5, rtol=1e-5)
    np.testing.assert_allclose(entropy, ref_entropy, atol=1e-5, rtol=1e-5)


def test_temperature_and_gradients_match_naive():
    hidden, unembed, targets = _inputs(seed=1)
    weights = jax.random.uniform(jax.random.key(2), targets.shape)

    def objective(fn):
        def f(h, w):
            logp, ent = fn(h, w)
            return jnp.sum(weights * logp) + 0.1 * jnp.sum(ent)

        return jax.jit(jax.value_and_grad(f, argnums=(0, 1)))(hidden, unembed)

    chunked = objective(
        lambda h, w: chunked_token_logprobs(h, w, targets, chunk_size=8, temperature=0.7)
    )
    naive = objective(lambda h, w: _naive(h, w, targets, temperature=0.7))
    for a, b in zip(jax.tree.leaves(chunked), jax.tree.leaves(naive), strict=True):
        np.testing.assert_allclose(a, b, atol=1e-4, rtol=1e-4)


def test_peak_memory_stays_below_full_logits():
    b, t, d, v = 2, 512, 16, 4096
    hidden, unembed, targets = (
        jax.ShapeDtypeStruct((b, t, d), jnp.float32),
        jax.ShapeDtypeStruct((d, v), jnp.float32),
        jax.ShapeDtypeStruct((b, t), jnp.int32),
    )
    full_logits_bytes = b * t * v * 4

    def loss(h, w, tg):
        return jnp.sum(chunked_token_logprobs(h, w, tg, chunk_size=32)[0])

    compiled = jax.jit(jax.grad(loss, argnums=(0, 1))).lower(hidden, unembed, targets).compile()
    assert compiled.memory_analysis().temp_size_in_bytes < full_logits_bytes / 4


def test_bad_shapes_raise():
    hidden, unembed, targets = _inputs()
    with pytest.raises(ValueError, match="targets"):
        chunked_token_logprobs(hidden, unembed, targets[:, :5])
    with pytest.raises(ValueError, match="unembedding must be"):
        chunked_token_logprobs(hidden, unembed.T, targets)
    with pytest.raises(ValueError, match="positive"):
        chunked_token_logprobs(hidden, unembed, targets, chunk_size=0)


@pytest.mark.parametrize("chunk_size", [5, 64])
def test_top_logprobs_are_the_full_distributions_most_likely_tokens(chunk_size):
    hidden, unembed, _ = _inputs(seed=4)
    ids, logp = chunked_top_logprobs(hidden, unembed, 7, chunk_size=chunk_size)
    full = np.asarray(jax.nn.log_softmax(hidden @ unembed, axis=-1))
    assert ids.shape == logp.shape == (*hidden.shape[:2], 7) and ids.dtype == jnp.int32
    want = np.sort(full, axis=-1)[..., ::-1][..., :7]
    np.testing.assert_allclose(logp, want, atol=1e-5)
    np.testing.assert_allclose(np.take_along_axis(full, np.asarray(ids), -1), logp, atol=1e-5)
    assert np.all(np.diff(np.asarray(logp), axis=-1) <= 0)  # most likely first
    with pytest.raises(ValueError, match=r"k must be in \[1, V=50\]"):
        chunked_top_logprobs(hidden, unembed, 51)


def test_candidate_logprobs_equal_the_full_softmax_at_those_ids_values_and_grads():
    hidden, unembed, _ = _inputs(seed=5)
    candidates = jax.random.randint(jax.random.key(6), (*hidden.shape[:2], 4), 0, 50)
    weights = jax.random.normal(jax.random.key(7), candidates.shape)

    def chunked(h, w):
        return jnp.sum(weights * chunked_candidate_logprobs(h, w, candidates, chunk_size=6))

    def naive(h, w):
        full = jax.nn.log_softmax(h @ w, axis=-1)
        return jnp.sum(weights * jnp.take_along_axis(full, candidates, -1))

    np.testing.assert_allclose(chunked(hidden, unembed), naive(hidden, unembed), rtol=1e-5)
    for got, want in zip(
        jax.grad(chunked, argnums=(0, 1))(hidden, unembed),
        jax.grad(naive, argnums=(0, 1))(hidden, unembed),
        strict=True,
    ):
        np.testing.assert_allclose(got, want, atol=1e-4, rtol=1e-4)
    with pytest.raises(ValueError, match=r"candidates must be \[B, T, K\]"):
        chunked_candidate_logprobs(hidden, unembed, candidates[..., 0])
