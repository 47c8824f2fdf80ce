"""Attention layouts: the stacked (decode) and repeated (prefill / training) paths of
`layers.attend` compute the same grouped-query attention, values and gradients."""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sao_jax.models.layers import (
    MAX_QUERY_BLOCKS,
    attend,
    attend_causal,
    attend_repeated,
    attend_stacked,
    query_blocks,
)


def _inputs(b, t, s, h, k, d, seed=0):
    rng = np.random.default_rng(seed)
    q = jnp.asarray(rng.standard_normal((b, t, h, d)), jnp.float32)
    keys = jnp.asarray(rng.standard_normal((b, k, s, d)), jnp.float32)
    values = jnp.asarray(rng.standard_normal((b, k, s, d)), jnp.float32)
    mask = jnp.asarray(rng.random((b, t, s)) < 0.7)
    return q, keys, values, mask.at[:, :, 0].set(True)


def _reference(q, keys, values, mask):
    """Plain per-head attention with explicit kv-head lookup (head i reads kv head i // G)."""
    b, t, h, d = q.shape
    g = h // keys.shape[1]
    out = np.zeros((b, t, h, d), np.float64)
    q, keys, values, mask = (np.asarray(x, np.float64) for x in (q, keys, values, mask))
    for head in range(h):
        scores = np.einsum("btd,bsd->bts", q[:, :, head], keys[:, head // g]) / np.sqrt(d)
        scores = np.where(mask > 0, scores, -np.inf)
        probs = np.exp(scores - scores.max(-1, keepdims=True))
        probs /= probs.sum(-1, keepdims=True)
        out[:, :, head] = np.einsum("bts,bsd->btd", probs, values[:, head // g])
    return out


@pytest.mark.parametrize(("heads", "kv_heads", "t"), [(4, 2, 5), (4, 1, 3), (2, 2, 4), (4, 2, 1)])
def test_both_layouts_equal_per_head_attention(heads, kv_heads, t):
    inputs = _inputs(2, t, 6, heads, kv_heads, 8)
    expected = _reference(*inputs)
    for layout in (attend_stacked, attend_repeated, attend):
        np.testing.assert_allclose(np.asarray(layout(*inputs)), expected, rtol=1e-5, atol=1e-5)


def test_both_layouts_have_the_same_gradients():
    inputs = _inputs(2, 7, 7, 4, 2, 8, seed=1)

    def grads(layout):
        loss = lambda q, k, v: jnp.sum(jnp.sin(layout(q, k, v, inputs[3])))  # noqa: E731
        return jax.jit(jax.grad(loss, argnums=(0, 1, 2)))(*inputs[:3])

    for a, b in zip(grads(attend_stacked), grads(attend_repeated), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-5)


def _causal_segment_mask(lengths, segments, t):
    """[B, T, T] masks as `attention_context` builds them: causal within each segment (the
    row's tokens split into `segments` runs of random length), padding after `lengths`."""
    rng = np.random.default_rng(len(lengths))
    masks = []
    for length in lengths:
        segment = np.zeros(t, np.int32)
        cuts = np.sort(rng.choice(np.arange(1, max(length, 2)), segments - 1, replace=False))
        segment[:length] = 1 + np.searchsorted(cuts, np.arange(length), side="right")
        same = (segment[:, None] == segment[None, :]) & (segment[:, None] > 0)
        masks.append(same & np.tri(t, dtype=bool))
    return jnp.asarray(np.stack(masks))


@pytest.mark.parametrize(
    ("t", "block", "segments"),
    [(13, 4, 1), (13, 4, 3), (16, 8, 2), (5, 8, 1), (9, 0, 2), (50, 2, 4)],
)
def test_causal_query_blocks_equal_whole_row_attention_values_and_gradients(t, block, segments):
    q, keys, values, _ = _inputs(3, t, t, 4, 2, 8, seed=t)
    mask = _causal_segment_mask([t, t - 2, max(t // 2, 1)], segments, t)

    real = mask.any(-1)[..., None, None]  # padding queries see nothing: their output is noise

    def loss(layout):
        return lambda q, k, v: jnp.sum(jnp.where(real, jnp.sin(layout(q, k, v, mask)), 0.0))

    blocked = lambda q, k, v, m: attend_causal(q, k, v, m, block)  # noqa: E731
    with np.errstate(invalid="ignore"):
        expected = np.where(real, _reference(q, keys, values, mask), 0.0)
    got = np.where(real, np.asarray(blocked(q, keys, values, mask)), 0.0)
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)
    expected = jax.grad(loss(attend), argnums=(0, 1, 2))(q, keys, values)
    got = jax.grad(loss(blocked), argnums=(0, 1, 2))(q, keys, values)
    for a, b in zip(got, expected, strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-5)


def test_query_blocks_cover_the_row_in_order_and_at_most_the_cap():
    assert query_blocks(224, 64) == [(0, 64), (64, 128), (128, 192), (192, 224)]
    assert query_blocks(10, 0) == [(0, 10)]
    assert query_blocks(10, 64) == [(0, 10)]
    for length, block in [(4096, 64), (1000, 7), (513, 64), (8, 1)]:
        blocks = query_blocks(length, block)
        assert len(blocks) <= MAX_QUERY_BLOCKS
        assert blocks[0][0] == 0 and blocks[-1][1] == length
        assert all(e == a for (_, e), (a, _) in itertools.pairwise(blocks))
        assert all(e - a >= min(block, length) for a, e in blocks[:-1])
    with pytest.raises(ValueError, match="query block must be >= 0"):
        query_blocks(10, -1)
