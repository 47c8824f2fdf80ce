"""Critic: initialised from the policy, values [B, T], freezable attention by path pattern."""

import functools
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from sao_jax.models import Critic, get_model_config, init_model

CONFIG = get_model_config(
    "tiny",
    vocab_size=40,
    d_model=32,
    num_heads=4,
    num_kv_heads=2,
    head_dim=8,
    num_experts=4,
    moe_intermediate_size=16,
    num_layers=1,
    initializer_range=0.2,
    capacity_factor=0.0,
)


@pytest.fixture(scope="module")
def policy():
    return init_model(CONFIG)


@functools.partial(jax.jit, static_argnums=0)
def _run(graphdef, state, tokens, segment_ids):
    """(values, aux, hidden) of a critic in one compiled function."""
    critic = nnx.merge(graphdef, state)
    values, aux = critic.values_and_aux(tokens, segment_ids=segment_ids)
    return values, aux, critic.forward(tokens, segment_ids=segment_ids).hidden


def _values(critic, tokens, segment_ids=None):
    segment_ids = jnp.ones_like(tokens) if segment_ids is None else segment_ids
    return _run(*nnx.split(critic), tokens, segment_ids)


def test_critic_from_policy_copies_backbone_and_predicts_values(policy):
    critic = Critic.from_policy(policy)
    policy_params = dict(nnx.to_flat_state(nnx.state(policy)))
    critic_params = dict(nnx.to_flat_state(nnx.state(critic)))
    head = {p for p in critic_params if p[0] == "value_head"}
    assert head == {("value_head", "kernel"), ("value_head", "bias")}
    for path, variable in critic_params.items():
        if path not in head:
            np.testing.assert_array_equal(variable.get_value(), policy_params[path].get_value())

    tokens = jax.random.randint(jax.random.key(0), (2, 6), 0, CONFIG.vocab_size)
    values, aux, _ = _values(critic, tokens)
    assert values.shape == (2, 6) and values.dtype == jnp.float32
    np.testing.assert_array_equal(values, 0.0)  # zero-initialised head
    assert aux.expert_load.shape == (CONFIG.num_layers, CONFIG.num_experts)

    kernel = jax.random.normal(jax.random.key(1), critic.value_head.kernel.shape)
    critic.value_head.kernel.set_value(kernel)
    values, _, hidden = _values(critic, tokens)
    np.testing.assert_allclose(values, (hidden @ kernel)[..., 0], atol=1e-5)
    assert float(jnp.std(values)) > 0
    # Values are causal: changing the last token changes only the last value.
    changed = tokens.at[:, -1].set((tokens[:, -1] + 1) % CONFIG.vocab_size)
    new_values, _, _ = _values(critic, changed)
    np.testing.assert_allclose(new_values[:, :-1], values[:, :-1], atol=1e-5)
    assert not np.allclose(new_values[:, -1], values[:, -1])
    # Padding (whatever its content) leaves the other positions' values unchanged.
    segments = jnp.array([[1, 1, 1, 1, 0, 0]] * 2)
    padded, _, _ = _values(critic, tokens, segments)
    garbage, _, _ = _values(critic, tokens.at[:, 4:].set(3), segments)
    np.testing.assert_allclose(padded[:, :4], values[:, :4], atol=1e-5)
    np.testing.assert_allclose(garbage[:, :4], values[:, :4], atol=1e-5)


def test_attention_parameters_are_selectable_by_path_pattern(policy):
    critic = Critic.from_policy(policy)
    paths = ["/".join(map(str, p)) for p, _ in nnx.to_flat_state(nnx.state(critic))]
    frozen = [p for p in paths if re.search(r"^layers/\d+/attn/", p)]
    per_layer = {"q_proj/kernel", "k_proj/kernel", "v_proj/kernel", "o_proj/kernel"}
    per_layer |= {"q_norm/scale", "k_norm/scale"}
    assert len(frozen) == CONFIG.num_layers * len(per_layer)
    assert "layers/0/moe/experts/gate_proj" in paths
    assert "value_head/kernel" in paths
