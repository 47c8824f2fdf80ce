"""Transformer forward: shapes, padding / packing invariance, MoE statistics, heads.

Inputs use two shapes, [2, 10] and [2, 5], and always pass positions and segment ids, so the
whole module compiles the forward only a few times.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from sao_jax.models import Transformer, get_model_config, init_model

CONFIG = get_model_config(
    "tiny",
    vocab_size=61,
    d_model=32,
    num_heads=4,
    num_kv_heads=2,
    head_dim=8,
    num_experts=4,
    moe_intermediate_size=16,
    dense_intermediate_size=24,
    initializer_range=0.2,
    capacity_factor=0.0,
)


class Jitted:
    """The model's forward / logits under one jit (eager op-by-op dispatch is slow on CPU)."""

    def __init__(self, model: Transformer, config=None):
        """`config`: run `model`'s parameters under another config of the same shapes."""
        if config is not None:
            abstract = nnx.eval_shape(lambda: Transformer(config, rngs=nnx.Rngs(0)))
            model = nnx.merge(nnx.graphdef(abstract), nnx.state(model))
        graphdef, self.state = nnx.split(model)
        self.model = model
        self._forward = jax.jit(lambda s, ids, **kw: nnx.merge(graphdef, s).forward(ids, **kw))

    def forward(self, ids, positions=None, segment_ids=None, kv_cache=None):
        b, t = ids.shape
        if positions is None:
            positions = jnp.broadcast_to(jnp.arange(t), (b, t))
        if segment_ids is None:
            segment_ids = jnp.ones((b, t), jnp.int32)
        kw = dict(positions=positions, segment_ids=segment_ids, kv_cache=kv_cache)
        return self._forward(self.state, ids, **kw)

    def __call__(self, ids, **kw):
        return self.model.logits(self.forward(ids, **kw).hidden)


@pytest.fixture(scope="module")
def model():
    return Jitted(init_model(CONFIG))


def _ids(shape=(2, 10), seed=0):
    return jax.random.randint(jax.random.key(seed), shape, 0, CONFIG.vocab_size, jnp.int32)


def test_logits_shape_dtype_and_causality(model):
    ids = _ids()
    logits = model(ids)
    assert logits.shape == (2, 10, CONFIG.vocab_size)
    assert logits.dtype == jnp.float32
    assert np.isfinite(np.asarray(logits)).all()
    changed = model(ids.at[:, 6:].set((ids[:, 6:] + 1) % CONFIG.vocab_size))
    np.testing.assert_allclose(logits[:, :6], changed[:, :6], atol=1e-6)
    assert not np.allclose(logits[:, 6:], changed[:, 6:])


def test_padding_never_changes_results(model):
    short = _ids((2, 5))
    padded = jnp.concatenate([short, jnp.full((2, 5), 7, jnp.int32)], axis=1)
    segments = jnp.array([[1] * 5 + [0] * 5] * 2)
    plain = model.forward(short)
    pad = model.forward(padded, segment_ids=segments)
    np.testing.assert_allclose(plain.hidden, pad.hidden[:, :5], atol=1e-5)
    # Router statistics ignore padding tokens too.
    np.testing.assert_allclose(plain.aux.expert_load, pad.aux.expert_load, atol=1e-6)
    np.testing.assert_allclose(plain.aux.load_balance_loss, pad.aux.load_balance_loss, rtol=1e-5)


def test_packed_segments_equal_separate_rows(model):
    a, b = _ids((2, 5), 1), _ids((2, 5), 2)
    packed = jnp.concatenate([a, b], axis=1)
    segments = jnp.array([[1] * 5 + [2] * 5] * 2)
    positions = jnp.array([list(range(5)) * 2] * 2)
    out = model(packed, positions=positions, segment_ids=segments)
    np.testing.assert_allclose(out[:, :5], model(a), atol=1e-5)
    np.testing.assert_allclose(out[:, 5:], model(b), atol=1e-5)


def test_moe_statistics_are_consistent(model):
    out = model.forward(_ids())
    load = np.asarray(out.aux.expert_load)
    assert load.shape == (CONFIG.num_layers, CONFIG.num_experts)
    np.testing.assert_allclose(load.sum(axis=1), 1.0, atol=1e-6)
    assert float(out.aux.dropped_fraction) == 0.0  # capacity_factor=0: dropless
    # Switch load-balance loss is >= top_k, with equality only for a uniform router.
    assert float(out.aux.load_balance_loss) >= CONFIG.num_experts_per_token * 0.99
    assert float(out.aux.router_z_loss) > 0


def test_capacity_drops_are_reported(model):
    out = Jitted(model.model, CONFIG.replace(capacity_factor=0.5)).forward(_ids())
    assert 0.4 <= float(out.aux.dropped_fraction) < 1.0  # at least half cannot fit


def test_dense_layers_and_untied_head_paths():
    config = CONFIG.replace(dense_layers=(1,), tie_embeddings=False)
    model = Jitted(init_model(config))
    paths = {"/".join(map(str, p)) for p, _ in nnx.to_flat_state(model.state)}
    assert "layers/0/moe/experts/gate_proj" in paths
    assert "layers/0/moe/router/kernel" in paths
    assert "layers/1/mlp/gate_proj/kernel" in paths
    assert "layers/1/attn/q_proj/kernel" in paths
    assert "lm_head/kernel" in paths
    out = model.forward(_ids())
    assert out.aux.expert_load.shape == (1, CONFIG.num_experts)  # one MoE layer
    expected = out.hidden @ model.model.lm_head.kernel[...]
    np.testing.assert_allclose(model.model.logits(out.hidden), expected, atol=1e-5)


def test_tied_head_uses_the_embedding(model):
    out = model.forward(_ids())
    expected = out.hidden @ model.model.embed.embedding[...].T
    np.testing.assert_allclose(model.model.logits(out.hidden), expected, atol=1e-5)


def test_kv_cache_forward_equals_full_forward(model):
    ids = _ids()
    full = model.forward(ids).hidden
    shape = (2, CONFIG.num_kv_heads, 12, CONFIG.head_dim)
    cache = tuple((jnp.zeros(shape), jnp.zeros(shape)) for _ in range(CONFIG.num_layers))
    first = model.forward(ids[:, :5], kv_cache=cache)
    positions = jnp.broadcast_to(jnp.arange(5, 10), (2, 5))
    rest = model.forward(ids[:, 5:], positions=positions, kv_cache=first.kv_cache)
    np.testing.assert_allclose(first.hidden, full[:, :5], atol=1e-5)
    np.testing.assert_allclose(rest.hidden, full[:, 5:], atol=1e-5)
    with pytest.raises(ValueError, match="kv_cache has 1 layers"):
        model.model.forward(ids, kv_cache=cache[:1])


def test_bfloat16_forward_is_close_to_float32(model):
    bf16 = Jitted(model.model, CONFIG.replace(dtype="bfloat16"))
    ids = _ids()
    assert bf16.forward(ids).hidden.dtype == jnp.bfloat16
    p32 = jax.nn.softmax(model(ids), -1)
    p16 = jax.nn.softmax(bf16(ids), -1)
    assert float(jnp.max(jnp.abs(p32 - p16))) < 0.05
