"""Transformer forward: shapes, padding / packing invariance, MoE statistics, heads."""

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

    def forward(self, ids, **kw):
        return self._forward(self.state, ids, **kw)

    def __call__(self, ids, **kw):
        return self.model.logits(self.forward(ids, **kw).hidden)

    def logits(self, hidden):
        return self.model.logits(hidden)


@pytest.fixture(scope="module")
def model():
    return Jitted(init_model(CONFIG))


def _ids(shape, seed=0):
    return jax.random.randint(jax.random.key(seed), shape, 0, CONFIG.vocab_size, jnp.int32)


def test_logits_shape_and_dtype(model):
    logits = model(_ids((2, 7)))
    assert logits.shape == (2, 7, CONFIG.vocab_size)
    assert logits.dtype == jnp.float32
    assert np.isfinite(np.asarray(logits)).all()


def test_causality_future_tokens_do_not_change_the_past(model):
    ids = _ids((1, 10))
    changed = ids.at[0, 6:].set((ids[0, 6:] + 1) % CONFIG.vocab_size)
    a, b = model(ids), model(changed)
    np.testing.assert_allclose(a[0, :6], b[0, :6], atol=1e-6)
    assert not np.allclose(a[0, 6:], b[0, 6:])


def test_padding_never_changes_results(model):
    ids = _ids((1, 6))
    padded = jnp.concatenate([ids, jnp.zeros((1, 4), jnp.int32) + 7], axis=1)
    segments = jnp.array([[1] * 6 + [0] * 4])
    plain = model.forward(ids)
    pad = model.forward(padded, segment_ids=segments)
    np.testing.assert_allclose(plain.hidden, pad.hidden[:, :6], atol=1e-5)
    # Router statistics ignore padding tokens too.
    np.testing.assert_allclose(plain.aux.expert_load, pad.aux.expert_load, atol=1e-6)
    np.testing.assert_allclose(plain.aux.load_balance_loss, pad.aux.load_balance_loss, rtol=1e-5)


def test_packed_segments_equal_separate_rows(model):
    a, b = _ids((1, 5), 1), _ids((1, 4), 2)
    packed = jnp.concatenate([a, b], axis=1)
    segments = jnp.array([[1] * 5 + [2] * 4])
    positions = jnp.array([list(range(5)) + list(range(4))])
    out = model(packed, positions=positions, segment_ids=segments)
    np.testing.assert_allclose(out[:, :5], model(a), atol=1e-5)
    np.testing.assert_allclose(out[:, 5:], model(b), atol=1e-5)


def test_moe_statistics_are_consistent(model):
    out = model.forward(_ids((3, 9)))
    load = np.asarray(out.aux.expert_load)
    assert load.shape == (CONFIG.num_layers, CONFIG.num_experts)
    np.testing.assert_allclose(load.sum(axis=1), 1.0, atol=1e-6)
    assert float(out.aux.dropped_fraction) == 0.0  # capacity_factor=0: dropless
    # Switch load-balance loss is >= top_k, with equality only for a uniform router.
    assert float(out.aux.load_balance_loss) >= CONFIG.num_experts_per_token * 0.99
    assert float(out.aux.router_z_loss) > 0


def test_capacity_drops_are_reported(model):
    config = CONFIG.replace(capacity_factor=0.5)
    out = Jitted(model.model, config).forward(_ids((4, 16)))
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
    out = model.forward(_ids((2, 5)))
    assert out.aux.expert_load.shape == (1, CONFIG.num_experts)  # one MoE layer
    np.testing.assert_allclose(
        model.logits(out.hidden), out.hidden @ model.model.lm_head.kernel[...], atol=1e-5
    )


def test_tied_head_uses_the_embedding(model):
    out = model.forward(_ids((1, 4)))
    expected = out.hidden @ model.model.embed.embedding[...].T
    np.testing.assert_allclose(model.logits(out.hidden), expected, atol=1e-5)


def test_kv_cache_forward_equals_full_forward(model):
    ids = _ids((2, 8))
    full = model.forward(ids).hidden
    shape = (2, CONFIG.num_kv_heads, 12, CONFIG.head_dim)
    cache = tuple((jnp.zeros(shape), jnp.zeros(shape)) for _ in range(CONFIG.num_layers))
    first = model.forward(ids[:, :5], kv_cache=cache)
    positions = jnp.broadcast_to(jnp.arange(5, 8), (2, 3))
    rest = model.forward(ids[:, 5:], positions=positions, kv_cache=first.kv_cache)
    np.testing.assert_allclose(first.hidden, full[:, :5], atol=1e-5)
    np.testing.assert_allclose(rest.hidden, full[:, 5:], atol=1e-5)
    with pytest.raises(ValueError, match="kv_cache has 1 layers"):
        model.forward(ids, kv_cache=cache[:1])


def test_bfloat16_forward_is_close_to_float32(model):
    bf16 = Jitted(model.model, CONFIG.replace(dtype="bfloat16"))
    ids = _ids((2, 6))
    assert bf16.forward(ids).hidden.dtype == jnp.bfloat16
    p32 = jax.nn.softmax(model(ids), -1)
    p16 = jax.nn.softmax(bf16(ids), -1)
    assert float(jnp.max(jnp.abs(p32 - p16))) < 0.05
