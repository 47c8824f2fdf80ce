"""Attention layouts: the stacked (decode) and repeated (prefill / training) paths of
`layers.attend` compute the same grouped-query attention, values and gradients."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sao_jax.models.layers import attend, attend_repeated, attend_stacked


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
