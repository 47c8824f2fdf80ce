"""The learner's transformed log-probs equal the sampler kernel's behaviour log-probs."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sao_jax.models.decoding import (
    LOGP_FLOOR,
    chunked_transformed_logprobs,
    transformed_logprob,
)
from sao_jax.rollout import sampling

# jitted once each: op-by-op dispatch would compile every primitive separately
behaviour_logprob = jax.jit(sampling.behaviour_logprob)
sample_tokens = jax.jit(sampling.sample_tokens)
allowed_tokens = jax.jit(sampling.allowed_tokens, static_argnums=1)
transformed_logprob = jax.jit(transformed_logprob)

SETTINGS = [  # (temperature, top_k, top_p)
    (1.0, 0, 1.0),
    (0.7, 0, 1.0),
    (0.7, 5, 0.9),
    (1.3, 0, 0.8),
    (0.5, 3, 1.0),
    (1.0, 1, 1.0),
]


def _draw(logits, settings, seed):
    n = logits.shape[0]
    temp = jnp.asarray([s[0] for s in settings] * (n // len(settings)), jnp.float32)
    top_k = jnp.asarray([s[1] for s in settings] * (n // len(settings)), jnp.int32)
    top_p = jnp.asarray([s[2] for s in settings] * (n // len(settings)), jnp.float32)
    keys = jax.random.split(jax.random.key(seed), n)
    tokens = sample_tokens(logits, keys, temp, top_k, top_p)
    return tokens, temp, top_k, top_p


def test_equals_the_sampler_behaviour_logprob_for_every_setting():
    vocab = 64
    logits = 3.0 * jax.random.normal(jax.random.key(0), (len(SETTINGS) * 8, vocab))
    tokens, temp, top_k, top_p = _draw(logits, SETTINGS, 1)
    expected = behaviour_logprob(logits, tokens, temp, top_k, top_p)
    got = transformed_logprob(logits, tokens, temp, top_k, top_p)
    np.testing.assert_allclose(np.asarray(got), np.asarray(expected), atol=2e-5, rtol=1e-5)
    # not the plain temperature-1 log-prob wherever the transform changes the distribution
    plain = jax.nn.log_softmax(logits)[jnp.arange(tokens.shape[0]), tokens]
    changed = np.asarray((temp != 1.0) | (top_k > 0) | (top_p < 1.0))
    assert np.all(np.abs(np.asarray(plain - got))[changed & (np.asarray(top_k) != 1)] > 1e-4)
    np.testing.assert_array_equal(np.asarray(got)[np.asarray(top_k) == 1], 0.0)


def test_with_a_grammar_mask_applied_to_the_logits_first():
    vocab = 64
    n = len(SETTINGS) * 4
    logits = 2.0 * jax.random.normal(jax.random.key(2), (n, vocab))
    bits = np.zeros((n, vocab // 32), np.uint32)
    rng = np.random.default_rng(3)
    allowed = rng.random((n, vocab)) < 0.3
    for i, j in zip(*np.nonzero(allowed), strict=True):
        bits[i, j // 32] |= np.uint32(1 << (j % 32))
    mask = allowed_tokens(jnp.asarray(bits.view(np.int32)), vocab)
    masked = jnp.where(mask, logits, -jnp.inf)
    tokens, temp, top_k, top_p = _draw(masked, SETTINGS, 4)
    assert np.all(np.asarray(mask)[np.arange(n), np.asarray(tokens)])
    expected = behaviour_logprob(masked, tokens, temp, top_k, top_p)
    got = transformed_logprob(masked, tokens, temp, top_k, top_p)
    np.testing.assert_allclose(np.asarray(got), np.asarray(expected), atol=2e-5, rtol=1e-5)


def test_greedy_is_a_point_mass_and_dropped_tokens_hit_the_floor():
    logits = jnp.asarray([[0.0, 2.0, 1.0], [0.0, 2.0, 1.0], [0.0, 2.0, 1.0]])
    tokens = jnp.asarray([1, 2, 0])
    temp = jnp.asarray([0.0, 0.0, 1.0])
    top_k = jnp.asarray([0, 0, 2])
    top_p = jnp.ones(3)
    got = np.asarray(transformed_logprob(logits, tokens, temp, top_k, top_p))
    np.testing.assert_array_equal(got, [0.0, LOGP_FLOOR, LOGP_FLOOR])
    grad = jax.grad(lambda x: transformed_logprob(x, tokens, temp, top_k, top_p).sum())(logits)
    assert np.all(np.isfinite(np.asarray(grad))) and not np.any(np.asarray(grad))


def test_gradient_is_that_of_the_softmax_over_the_kept_set():
    logits = jax.random.normal(jax.random.key(5), (4, 16))
    tokens = jnp.argmax(logits, axis=-1)
    temp, top_k, top_p = jnp.full(4, 0.5), jnp.full(4, 4, jnp.int32), jnp.ones(4)
    grad = jax.grad(lambda x: transformed_logprob(x, tokens, temp, top_k, top_p).sum())(logits)
    keep = np.argsort(-np.asarray(logits), axis=-1)[:, :4]
    outside = np.ones((4, 16), bool)
    np.put_along_axis(outside, keep, False, axis=-1)
    assert not np.any(np.asarray(grad)[outside])
    kept = np.take_along_axis(np.asarray(logits), keep, axis=-1) / 0.5
    probs = np.exp(kept - kept.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    np.testing.assert_allclose(
        np.take_along_axis(np.asarray(grad), keep, axis=-1)[:, 0],
        (1 - probs[:, 0]) / 0.5,
        rtol=1e-4,
    )


@pytest.mark.parametrize("chunk_size", [3, 256])
def test_chunked_matches_the_direct_form(chunk_size):
    b, k, d, v = 2, 7, 8, 32
    hidden = jax.random.normal(jax.random.key(6), (b, k, d))
    w = jax.random.normal(jax.random.key(7), (d, v))
    settings = jnp.asarray([*SETTINGS[: k - 1], (0.0, 0, 1.0)])
    temp = jnp.tile(settings[:, 0], (b, 1))
    top_k = jnp.tile(settings[:, 1], (b, 1)).astype(jnp.int32)
    top_p = jnp.tile(settings[:, 2], (b, 1))
    targets = jax.random.randint(jax.random.key(8), (b, k), 0, v)
    got = chunked_transformed_logprobs(
        hidden, w, targets, temp, top_k, top_p, chunk_size=chunk_size
    )
    logits = jnp.einsum("bkd,dv->bkv", hidden, w).reshape(b * k, v)
    direct = transformed_logprob(
        logits, targets.reshape(-1), temp.reshape(-1), top_k.reshape(-1), top_p.reshape(-1)
    ).reshape(b, k)
    np.testing.assert_allclose(np.asarray(got), np.asarray(direct), atol=1e-5)


@pytest.mark.parametrize("chunk_size", [3, 256])
def test_chunked_with_grammar_masks_equals_the_sampler_on_masked_logits(chunk_size):
    """Masks as the learner passes them (each row's table flattened, an index per target, -1:
    unmasked), unpacked inside the chunks: the sampler's behaviour log-prob on its masked
    logits, for every setting (a vocabulary that is not a multiple of 32: the last word's
    high bits are ignored, as in the sampler)."""
    b, k, d, v = 2, 12, 8, 40
    rng = np.random.default_rng(9)
    hidden = jax.random.normal(jax.random.key(10), (b, k, d))
    w = 2.0 * jax.random.normal(jax.random.key(11), (d, v))
    words = (v + 31) // 32
    allowed = rng.random((b, 3, v)) < 0.4
    allowed[:, :, 0] = True  # never empty
    table = np.zeros((b, 4, words), np.uint32)  # one padding entry, as pack_masks leaves
    for r, m, i in zip(*np.nonzero(allowed), strict=True):
        table[r, m, i // 32] |= np.uint32(1 << (i % 32))
    table[:, :, -1] |= np.uint32(0xFFFF0000)  # bits past the vocabulary
    table = jnp.asarray(table.view(np.int32))
    index = jnp.asarray(rng.integers(-1, 3, (b, k)), jnp.int32)
    settings = jnp.asarray([*SETTINGS, (0.0, 0, 1.0)] * 2)[:k]
    temp = jnp.tile(settings[:, 0], (b, 1))
    top_k = jnp.tile(settings[:, 1], (b, 1)).astype(jnp.int32)
    top_p = jnp.tile(settings[:, 2], (b, 1))
    logits = jnp.einsum("bkd,dv->bkv", hidden, w).reshape(b * k, v)
    bits = jax.vmap(lambda t, i: t[i])(table, jnp.maximum(index, 0)).reshape(b * k, words)
    mask = allowed_tokens(bits, v) | (index.reshape(-1) < 0)[:, None]
    masked = jnp.where(mask, logits, -jnp.inf)
    flat = lambda x: x.reshape(-1)  # noqa: E731
    keys = jax.random.split(jax.random.key(12), b * k)
    targets = sample_tokens(masked, keys, flat(temp), flat(top_k), flat(top_p))
    expected = behaviour_logprob(masked, targets, flat(temp), flat(top_k), flat(top_p))
    got = chunked_transformed_logprobs(
        hidden,
        w,
        targets.reshape(b, k),
        temp,
        top_k,
        top_p,
        mask_index=jnp.where(index >= 0, jnp.arange(b)[:, None] * 4 + index, -1),
        mask_table=table.reshape(b * 4, words),
        chunk_size=chunk_size,
    )
    np.testing.assert_allclose(np.asarray(got).reshape(-1), np.asarray(expected), atol=2e-5)
    # and not the unmasked values wherever a mask removed mass from a sampled row
    plain = chunked_transformed_logprobs(
        hidden, w, targets.reshape(b, k), temp, top_k, top_p, chunk_size=chunk_size
    )
    differs = np.abs(np.asarray(plain - got)).reshape(-1) > 1e-4
    masked_rows = np.asarray((index.reshape(-1) >= 0) & (flat(temp) > 0))
    assert (
        differs[masked_rows].mean() > 0.5 and not differs[np.asarray(index.reshape(-1) < 0)].any()
    )
