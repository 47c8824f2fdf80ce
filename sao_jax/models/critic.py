"""Critic: the policy's backbone plus a scalar value head.

SAO initialises the critic from the policy and freezes its attention; the parameter paths
(`layers/{i}/attn/...`, `layers/{i}/moe/...`, `value_head/kernel`) make that a path pattern.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from sao_jax.models.config import ModelConfig
from sao_jax.models.logprobs import take_positions
from sao_jax.models.moe import MoeAux
from sao_jax.models.transformer import Backbone, Transformer


class Critic(Backbone):
    """Backbone + `value_head` (D -> 1, zero-initialised so training starts from V = 0)."""

    def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs):
        super().__init__(config, rngs=rngs)
        self.value_head = nnx.Linear(
            config.d_model,
            1,
            use_bias=True,
            dtype=config.compute_dtype,
            param_dtype=config.params_dtype,
            kernel_init=nnx.with_metadata(
                nnx.initializers.zeros_init(), logical_axes=("embed", None)
            ),
            bias_init=nnx.with_metadata(nnx.initializers.zeros_init(), logical_axes=(None,)),
            rngs=rngs,
        )

    @classmethod
    def from_policy(cls, policy: Transformer) -> Critic:
        """A critic whose backbone is a copy of `policy`'s (embedding, layers, final norm).

        The value head starts at zero; arrays keep the policy's shardings.
        """
        abstract = nnx.eval_shape(lambda: cls(policy.config, rngs=nnx.Rngs(0)))
        graphdef, state = nnx.split(abstract)
        policy_params = dict(nnx.to_flat_state(nnx.state(policy)))
        for path, variable in nnx.to_flat_state(state):
            if path[0] == "value_head":
                spec = variable.get_value()
                variable.set_value(jnp.zeros(spec.shape, spec.dtype))
            else:
                variable.set_value(jnp.copy(policy_params[path].get_value()))
        return nnx.merge(graphdef, state)

    def values_and_aux(
        self,
        tokens: jax.Array,
        *,
        positions: jax.Array | None = None,
        segment_ids: jax.Array | None = None,
        at: jax.Array | None = None,
    ) -> tuple[jax.Array, MoeAux]:
        """tokens [B, T] -> (values [B, T] float32, MoE aux of the critic's own routers).

        `at` [B, K] int: the value head runs at those columns only and values are [B, K].
        """
        out = self.forward(tokens, positions=positions, segment_ids=segment_ids)
        hidden = out.hidden if at is None else take_positions(out.hidden, at)
        return self.value_from_hidden(hidden), out.aux

    def value_from_hidden(self, hidden: jax.Array) -> jax.Array:
        """The value head: final hidden states [..., D] -> float32 values [...]."""
        return self.value_head(hidden)[..., 0].astype(jnp.float32)

    def values(
        self,
        tokens: jax.Array,
        *,
        positions: jax.Array | None = None,
        segment_ids: jax.Array | None = None,
    ) -> jax.Array:
        """tokens [B, T] int32 -> V(prefix up to and including t) [B, T] float32."""
        return self.values_and_aux(tokens, positions=positions, segment_ids=segment_ids)[0]
