"""Logical-axis sharding on 8 fake CPU devices: mesh construction, rules, parameters created
sharded, and sharded forward / train step equal to the unsharded ones."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx
from jax.sharding import AxisType, PartitionSpec

from sao_jax.models import get_model_config, init_model
from sao_jax.models.steps import make_forward, make_lm_train_step
from sao_jax.sharding import (
    MeshConfig,
    axis_rules,
    describe,
    logical_to_spec,
    make_mesh,
    named_sharding,
)

CONFIG = get_model_config(
    "tiny",
    vocab_size=64,
    d_model=32,
    num_heads=4,
    num_kv_heads=2,
    head_dim=8,
    num_experts=4,
    moe_intermediate_size=16,
    dense_intermediate_size=24,
    dense_layers=(1,),
    tie_embeddings=False,
    initializer_range=0.2,
    capacity_factor=0.0,
)
MESH = MeshConfig(data=1, fsdp=2, expert=2, tensor=2)


def test_mesh_config_resolves_the_rest_and_rejects_bad_sizes():
    assert MeshConfig(data=2, fsdp=-1).resolve(8) == (2, 4, 1, 1)
    assert MeshConfig(data=1, fsdp=2, expert=2, tensor=2).resolve(8) == (1, 2, 2, 2)
    with pytest.raises(ValueError, match="at most one mesh axis may be -1"):
        MeshConfig(data=-1, fsdp=-1).resolve(8)
    with pytest.raises(ValueError, match="do not split"):
        MeshConfig(data=3, fsdp=-1).resolve(8)
    with pytest.raises(ValueError, match="needs 4 devices, have 8"):
        MeshConfig(data=2, fsdp=2).resolve(8)
    with pytest.raises(ValueError, match="positive or -1"):
        MeshConfig(tensor=0).resolve(8)


def test_make_mesh_uses_all_devices_with_auto_axes():
    mesh = make_mesh(MESH)
    assert jax.device_count() == 8  # tests/conftest.py
    assert dict(mesh.shape) == {"data": 1, "fsdp": 2, "expert": 2, "tensor": 2}
    assert all(t == AxisType.Auto for t in mesh.axis_types)


def test_rules_map_logical_names_and_use_each_mesh_axis_once():
    assert logical_to_spec(("embed", "heads")) == PartitionSpec("fsdp", "tensor")
    assert logical_to_spec(("batch", "length", None)) == PartitionSpec(
        ("data", "fsdp", "expert"), None, None
    )
    # "heads" and "mlp" both want `tensor`; the second dim stays unsharded.
    assert logical_to_spec(("heads", "mlp")) == PartitionSpec("tensor", None)
    with axis_rules((("embed", "tensor"),)):
        assert logical_to_spec(("embed",)) == PartitionSpec("tensor")
    with pytest.raises(KeyError, match="logical axis 'nope' has no rule"):
        logical_to_spec(("nope",))
    # A dim that the mesh axis does not divide stays replicated instead of failing.
    mesh = make_mesh(MESH)
    assert named_sharding(mesh, ("vocab", "embed"), (61, 32)).spec == PartitionSpec(None, "fsdp")


def test_parameters_are_created_sharded():
    mesh = make_mesh(MESH)
    model = init_model(CONFIG, mesh=mesh)
    specs = describe(nnx.state(model))
    expected = {
        "embed/embedding": PartitionSpec("tensor", "fsdp"),
        "layers/0/attn/q_proj/kernel": PartitionSpec("fsdp", "tensor"),
        "layers/0/attn/o_proj/kernel": PartitionSpec("tensor", "fsdp"),
        "layers/0/moe/experts/gate_proj": PartitionSpec("expert", "fsdp", "tensor"),
        "layers/0/moe/experts/down_proj": PartitionSpec("expert", "tensor", "fsdp"),
        "layers/0/moe/router/kernel": PartitionSpec("fsdp", None),
        "layers/1/mlp/up_proj/kernel": PartitionSpec("fsdp", "tensor"),
        "lm_head/kernel": PartitionSpec("fsdp", "tensor"),
        "final_norm/scale": PartitionSpec(None),
    }
    for path, spec in expected.items():
        assert specs[path] == str(spec), path
    kernel = model.layers[0].moe.experts.gate_proj[...]
    assert kernel.addressable_shards[0].data.shape == (2, 16, 8)  # [4/2, 32/2, 16/2]


@pytest.fixture(scope="module")
def unsharded():
    return init_model(CONFIG)


def test_sharded_forward_equals_unsharded(unsharded):
    tokens = jax.random.randint(jax.random.key(0), (4, 12), 0, CONFIG.vocab_size)
    params, forward = make_forward(unsharded)
    expected = forward(params, tokens)
    mesh = make_mesh(MESH)
    sharded_params, sharded_forward = make_forward(unsharded, mesh)
    logits = sharded_forward(sharded_params, tokens)
    assert logits.sharding.spec == PartitionSpec(("data", "fsdp", "expert"), None, "tensor")
    np.testing.assert_allclose(np.asarray(logits), np.asarray(expected), atol=1e-5, rtol=1e-5)


def test_sharded_train_step_equals_unsharded():
    tokens = jax.random.randint(jax.random.key(1), (4, 12), 0, CONFIG.vocab_size)
    mask = jnp.ones_like(tokens)
    # Adam divides by sqrt(v) + eps: with optax's eps = 1e-8 a gradient of ~1e-7 whose rounding
    # differs between the two programs (reductions in another order) can move a parameter by
    # up to the whole learning rate in either. eps = 1e-3 keeps every update proportional to
    # its gradient, so rounding-level gradient differences stay rounding-level in the weights.
    optimizer = optax.adamw(1e-2, eps=1e-3)
    results = []
    # One MoE layer keeps the two train-step compilations short.
    single = init_model(CONFIG.replace(num_layers=1, dense_layers=(), capacity_factor=2.0))
    for mesh in (None, make_mesh(MESH)):
        # Same weights in fresh buffers: the steps donate their inputs.
        model = nnx.merge(nnx.graphdef(single), jax.tree.map(jnp.copy, nnx.state(single)))
        (params, opt_state), step = make_lm_train_step(
            model, optimizer, mesh=mesh, batch_shape=tokens.shape, chunk_size=8
        )
        for _ in range(2):
            params, opt_state, metrics = step(params, opt_state, tokens, mask)
        results.append((jax.device_get(params), jax.device_get(metrics)))
    (p0, m0), (p1, m1) = results
    np.testing.assert_allclose(m0["loss"], m1["loss"], rtol=1e-5)
    assert float(m0["loss"]) > 0
    for a, b in zip(jax.tree.leaves(p0), jax.tree.leaves(p1), strict=True):
        np.testing.assert_allclose(a, b, atol=1e-5, rtol=1e-5)
