"""MoE auxiliary-loss weights: one `MoeAuxConfig`, read by every objective that adds the loss."""

import jax.numpy as jnp
import numpy as np
import pytest

from sao_jax.models import MoeAux, MoeAuxConfig, get_model_config, init_model
from sao_jax.models.steps import next_token_loss


def _aux(load_balance: float, router_z: float) -> MoeAux:
    zero = jnp.zeros(())
    return MoeAux(
        load_balance_loss=jnp.asarray(load_balance),
        router_z_loss=jnp.asarray(router_z),
        expert_load=jnp.zeros((4,)),
        dropped_fraction=zero,
    )


def test_weighted_loss_uses_each_weight():
    aux = _aux(2.0, 5.0)
    np.testing.assert_allclose(aux.weighted_loss(MoeAuxConfig(0.5, 0.0)), 1.0)
    np.testing.assert_allclose(aux.weighted_loss(MoeAuxConfig(0.0, 0.1)), 0.5)
    np.testing.assert_allclose(aux.weighted_loss(MoeAuxConfig()), 2e-3 + 5e-3, rtol=1e-6)


@pytest.mark.parametrize("field", ["load_balance_weight", "router_z_weight"])
def test_negative_weight_is_refused(field):
    with pytest.raises(ValueError, match=f"MoeAuxConfig.{field} must be >= 0"):
        MoeAuxConfig(**{field: -1.0})


def test_next_token_loss_adds_the_given_weights():
    config = get_model_config(
        "tiny", vocab_size=31, d_model=16, num_layers=1, num_heads=2, num_kv_heads=1,
        head_dim=8, num_experts=4, moe_intermediate_size=8, dense_intermediate_size=8,
    )  # fmt: skip
    model = init_model(config)
    tokens = jnp.arange(12, dtype=jnp.int32).reshape(2, 6) % 31
    mask = jnp.ones_like(tokens)
    plain, metrics = next_token_loss(model, tokens, mask, moe_aux=MoeAuxConfig(0.0, 0.0))
    np.testing.assert_allclose(plain, metrics["nll"], rtol=1e-6)
    heavy, _ = next_token_loss(model, tokens, mask, moe_aux=MoeAuxConfig(10.0, 1.0))
    want = metrics["nll"] + 10.0 * metrics["load_balance_loss"] + metrics["router_z_loss"]
    np.testing.assert_allclose(heavy, want, rtol=1e-5)
    assert float(metrics["load_balance_loss"]) > 0
    default, _ = next_token_loss(model, tokens, mask)
    np.testing.assert_allclose(
        default, next_token_loss(model, tokens, mask, moe_aux=MoeAuxConfig())[0], rtol=1e-6
    )
