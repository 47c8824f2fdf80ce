"""Expert-parallel MoE dispatch on 8 fake CPU devices: equal to the single-device dispatches
(forward and gradients), per-destination capacity drops, padding, the whole model, and expert
weights whose per-device bytes shrink with the expert-axis size."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from sao_jax.models import get_dispatch, get_model_config, init_model
from sao_jax.models.expert_parallel import destination_capacity
from sao_jax.models.moe_dispatch import ExpertWeights, Routing
from sao_jax.sharding import MeshConfig, make_mesh

D, F, E, K = 16, 8, 8, 2


def _problem(n, *, seed=0, skewed=False):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, D)).astype(np.float32)
    index = np.stack([rng.choice(E, size=K, replace=False) for _ in range(n)]).astype(np.int32)
    if skewed:  # every token on experts 0 and 1: one device receives everything
        index = np.tile(np.array([[0, 1]], np.int32), (n, 1))
    weight = rng.uniform(0.1, 1.0, size=(n, K)).astype(np.float32)
    valid = np.ones(n, bool)
    valid[[1, 6]] = False
    weights = ExpertWeights(
        *(
            jnp.asarray(rng.normal(size=shape) / shape[1] ** 0.5, jnp.float32)
            for shape in ((E, D, F), (E, D, F), (E, F, D))
        )
    )
    return jnp.asarray(x), Routing(*map(jnp.asarray, (index, weight, valid))), weights


def _value_and_grads(name, x, routing, weights, capacity_factor=0.0):
    def loss(x, weights):
        y, kept = get_dispatch(name)(x, routing, weights, capacity_factor)
        return jnp.sum(jnp.sin(y)), (y, kept)

    return jax.jit(jax.value_and_grad(loss, argnums=(0, 1), has_aux=True))(x, weights)


@pytest.mark.parametrize(
    ("mesh_config", "n", "skewed"),
    [
        (MeshConfig(data=1, fsdp=2, expert=4, tensor=1), 64, False),
        (MeshConfig(data=1, fsdp=1, expert=4, tensor=2), 30, True),  # 30: padded to 32
        (MeshConfig(data=2, fsdp=1, expert=2, tensor=2), 24, False),
    ],
)
def test_dropless_expert_parallel_equals_single_device_dispatch(mesh_config, n, skewed):
    x, routing, weights = _problem(n, skewed=skewed)
    (_, (ref_y, ref_kept)), ref_grads = _value_and_grads("sorted_capacity", x, routing, weights)
    with jax.set_mesh(make_mesh(mesh_config)):
        (_, (y, kept)), grads = _value_and_grads("expert_parallel", x, routing, weights)
    np.testing.assert_allclose(y, ref_y, atol=2e-6)
    assert int(kept) == int(ref_kept) == (n - 2) * K
    assert np.all(np.asarray(y)[~np.asarray(routing.valid)] == 0)
    # float32 sums in another order differ in proportion to the gradient's size (seen: 1.05e-5
    # at g = 2.4 on an AMD CPU, gradients up to ~20), so the tolerance is relative as well.
    for got, want in zip(jax.tree.leaves(grads), jax.tree.leaves(ref_grads), strict=True):
        np.testing.assert_allclose(got, want, atol=1e-5, rtol=1e-5)
    if not skewed:  # and ragged_dot, the accelerator dispatch, agrees too
        ragged_y, _ = jax.jit(lambda *a: get_dispatch("ragged_dot")(*a, 0.0))(x, routing, weights)
        np.testing.assert_allclose(y, ragged_y, atol=2e-6)


def _capacity_reference(x, routing, weights, *, shards, ep, capacity):
    """Per home device (contiguous token blocks): assignments sorted by expert, the first
    `capacity` per destination device kept; returns (y, kept)."""
    x, index, weight, valid = map(
        np.asarray, (x, routing.expert_index, routing.expert_weight, routing.valid)
    )
    w = jax.tree.map(np.asarray, weights)
    per_device = E // ep
    n = x.shape[0] // shards
    out, kept = np.zeros_like(x), 0
    for block in range(shards):
        tokens = range(block * n, (block + 1) * n)
        assignments = [(index[t, j], t, j) for t in tokens for j in range(K) if valid[t]]
        used = np.zeros(ep, int)
        for expert, t, j in sorted(assignments, key=lambda a: a[0]):  # stable: (t, j) order
            if used[expert // per_device] >= capacity:
                continue
            used[expert // per_device] += 1
            kept += 1
            g, u = x[t] @ w.gate[expert], x[t] @ w.up[expert]
            out[t] += weight[t, j] * ((g / (1 + np.exp(-g)) * u) @ w.down[expert])
    return out, kept


def test_capacity_per_destination_drops_in_expert_order_and_reports_it():
    n, mesh_config = 64, MeshConfig(data=1, fsdp=2, expert=4, tensor=1)
    x, routing, weights = _problem(n, seed=3, skewed=False)
    # 8 home devices of 8 tokens each; capacity 0.5 * 8 * 2 / 4 = 2 rows per destination.
    capacity = destination_capacity(8, K, 4, E // 4, 0.5)
    assert capacity == 2
    ref_y, ref_kept = _capacity_reference(x, routing, weights, shards=8, ep=4, capacity=capacity)
    with jax.set_mesh(make_mesh(mesh_config)):
        y, kept = jax.jit(lambda *a: get_dispatch("expert_parallel")(*a, 0.5))(x, routing, weights)
        _, enough = jax.jit(lambda *a: get_dispatch("expert_parallel")(*a, 4.0))(
            x, routing, weights
        )
    np.testing.assert_allclose(y, ref_y, atol=2e-6)
    assert int(kept) == ref_kept < (n - 2) * K  # some assignments were dropped
    assert int(enough) == (n - 2) * K  # capacity 4 x the balanced share: nothing dropped here


def test_destination_capacity():
    assert destination_capacity(8, 2, 4, 2, 0.0) == 16  # dropless: n * min(K, E/ep)
    assert destination_capacity(8, 4, 4, 2, 0.0) == 16
    assert destination_capacity(8, 2, 4, 2, 1.0) == 4
    assert destination_capacity(8, 2, 4, 2, 100.0) == 16  # never above the dropless bound


def test_expert_axis_must_divide_the_experts():
    x, routing, weights = _problem(16)
    six = ExpertWeights(weights.gate[:6], weights.up[:6], weights.down[:6])
    routing = Routing(routing.expert_index % 6, routing.expert_weight, routing.valid)
    with (
        jax.set_mesh(make_mesh(MeshConfig(data=1, fsdp=2, expert=4, tensor=1))),
        pytest.raises(
            ValueError, match="6 experts do not split evenly over an expert axis of 4 devices"
        ),
    ):
        get_dispatch("expert_parallel")(x, routing, six, 0.0)


MODEL = get_model_config(
    "tiny",
    vocab_size=64,
    d_model=32,
    num_layers=2,
    num_heads=4,
    num_kv_heads=2,
    head_dim=8,
    num_experts=8,
    moe_intermediate_size=16,
    dense_intermediate_size=24,
    initializer_range=0.2,
    capacity_factor=0.0,
)


def test_model_with_expert_parallel_matches_single_device_dispatch():
    mesh = make_mesh(MeshConfig(data=1, fsdp=2, expert=4, tensor=1))
    config = MODEL.replace(num_layers=1)
    reference = init_model(config)
    parallel = init_model(config.replace(moe_dispatch="expert_parallel"), mesh=mesh)
    tokens = jnp.asarray(np.random.default_rng(0).integers(0, 64, (4, 12)), jnp.int32)

    def loss_and_grads(model):
        graphdef, params = nnx.split(model)

        def loss(params):
            out = nnx.merge(graphdef, params).forward(tokens)
            terms = jnp.sin(out.hidden)
            return jnp.sum(terms), (terms, out.aux.dropped_fraction)

        return jax.jit(jax.value_and_grad(loss, has_aux=True))(params)

    (ref_loss, (ref_terms, _)), ref_grads = loss_and_grads(reference)
    with jax.set_mesh(mesh):
        (loss, (terms, dropped)), grads = loss_and_grads(parallel)
    assert float(dropped) == 0.0
    np.testing.assert_allclose(terms, ref_terms, atol=1e-5)
    # The loss is a float32 sum of n terms of both signs whose reduction order differs between
    # the sharded and the single-device program: each sum is within the classic rounding bound
    # (n - 1) * eps * sum|terms| of the exact one, and the terms' own differences (checked
    # above) add at most their sum. A tolerance relative to the (cancelling) sum is not sound.
    ref_terms = np.asarray(ref_terms, np.float64)
    rounding = (ref_terms.size - 1) * np.finfo(np.float32).eps * np.abs(ref_terms).sum()
    terms_gap = np.abs(np.asarray(terms, np.float64) - ref_terms).sum()
    assert abs(float(loss) - float(ref_loss)) <= 2 * rounding + terms_gap
    # float32 sums in another order differ in proportion to the gradient's size (seen: 1.05e-5
    # at g = 2.4 on an AMD CPU, gradients up to ~20), so the tolerance is relative as well.
    for got, want in zip(jax.tree.leaves(grads), jax.tree.leaves(ref_grads), strict=True):
        np.testing.assert_allclose(got, want, atol=1e-5, rtol=1e-5)


def _device0_bytes(array: jax.Array) -> int:
    return sum(s.data.nbytes for s in array.addressable_shards if s.device == jax.devices()[0])


def test_expert_weight_bytes_per_device_shrink_with_the_expert_axis():
    config = MODEL.replace(num_layers=1, moe_dispatch="expert_parallel")
    full = None
    for ep in (1, 2, 4, 8):
        mesh = make_mesh(MeshConfig(data=-1, fsdp=1, expert=ep, tensor=1))
        model = init_model(config, mesh=mesh)
        experts = model.layers[0].moe.experts
        arrays = [experts.gate_proj[...], experts.up_proj[...], experts.down_proj[...]]
        full = full or sum(a.nbytes for a in arrays)
        assert sum(_device0_bytes(a) for a in arrays) == full // ep
