"""Routed Mixture-of-Experts feed-forward (softmax router, top-k, SwiGLU experts) and its stats.

The router runs in float32. Auxiliary losses and statistics count only valid (non-padding)
tokens, so padding never changes them.
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import jax.numpy as jnp
from flax import nnx, struct

from sao_jax.models.config import ModelConfig, MoeAuxConfig
from sao_jax.models.layers import _normal, dense
from sao_jax.models.moe_dispatch import ExpertWeights, Routing, get_dispatch


@struct.dataclass
class MoeStats:
    """Per-layer router statistics.

    load_balance_loss: Switch-style E * sum_e f_e * P_e (f_e: top-k assignments per token routed
      to e, P_e: mean router probability of e); equals K for a perfectly uniform router.
    router_z_loss: mean over tokens of logsumexp(router logits)^2.
    expert_load: [E] fraction of assignments routed to each expert (sums to 1).
    dropped_fraction: fraction of assignments that exceeded expert capacity.
    """

    load_balance_loss: jax.Array
    router_z_loss: jax.Array
    expert_load: jax.Array
    dropped_fraction: jax.Array


@struct.dataclass
class MoeAux:
    """Router statistics of a whole forward pass (means over MoE layers).

    expert_load: [L_moe, E] per MoE layer ([0, 0] for a model without MoE layers).
    """

    load_balance_loss: jax.Array
    router_z_loss: jax.Array
    expert_load: jax.Array
    dropped_fraction: jax.Array

    @classmethod
    def from_layers(cls, stats: Sequence[MoeStats]) -> MoeAux:
        if not stats:
            zero = jnp.zeros((), jnp.float32)
            return cls(zero, zero, jnp.zeros((0, 0), jnp.float32), zero)

        def mean(name: str) -> jax.Array:
            return jnp.mean(jnp.stack([getattr(s, name) for s in stats]))

        return cls(
            load_balance_loss=mean("load_balance_loss"),
            router_z_loss=mean("router_z_loss"),
            expert_load=jnp.stack([s.expert_load for s in stats]),
            dropped_fraction=mean("dropped_fraction"),
        )

    @classmethod
    def from_stacked(cls, stats: Sequence[MoeStats]) -> MoeAux:
        """Like `from_layers`, from per-group stats whose fields carry a leading layer axis
        (the scanned layers' outputs), groups in layer order."""
        if not stats:
            return cls.from_layers(())

        def cat(name: str) -> jax.Array:
            return jnp.concatenate([getattr(s, name) for s in stats], axis=0)

        return cls(
            load_balance_loss=jnp.mean(cat("load_balance_loss")),
            router_z_loss=jnp.mean(cat("router_z_loss")),
            expert_load=cat("expert_load"),
            dropped_fraction=jnp.mean(cat("dropped_fraction")),
        )

    def weighted_loss(self, weights: MoeAuxConfig) -> jax.Array:
        """The auxiliary loss (scalar) to add to a training objective."""
        return (
            weights.load_balance_weight * self.load_balance_loss
            + weights.router_z_weight * self.router_z_loss
        )


class Experts(nnx.Module):
    """E SwiGLU experts stored as stacked weights (one grouped einsum per projection)."""

    def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs):
        e, d, f = config.num_experts, config.d_model, config.moe_intermediate_size
        dtype = config.params_dtype
        in_axes = ("experts", "embed", "expert_mlp")
        out_axes = ("experts", "expert_mlp", "embed")
        self.gate_proj = nnx.Param(_normal(config, in_axes)(rngs.params(), (e, d, f), dtype))
        self.up_proj = nnx.Param(_normal(config, in_axes)(rngs.params(), (e, d, f), dtype))
        self.down_proj = nnx.Param(_normal(config, out_axes)(rngs.params(), (e, f, d), dtype))

    def weights(self, dtype: jnp.dtype) -> ExpertWeights:
        return ExpertWeights(
            gate=self.gate_proj[...].astype(dtype),
            up=self.up_proj[...].astype(dtype),
            down=self.down_proj[...].astype(dtype),
        )


class MoeBlock(nnx.Module):
    """Softmax router over E experts, top-k, optional top-k renormalisation, SwiGLU experts."""

    def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs):
        get_dispatch(config.moe_dispatch)  # fail before allocating anything
        self.router = dense(config, config.d_model, config.num_experts, ("embed", None), rngs=rngs)
        self.experts = Experts(config, rngs=rngs)
        self.num_experts = config.num_experts
        self.top_k = config.num_experts_per_token
        self.norm_topk_prob = config.norm_topk_prob
        self.capacity_factor = config.capacity_factor
        self.dispatch_name = config.moe_dispatch
        self.dtype = config.compute_dtype

    def __call__(self, x: jax.Array, valid: jax.Array) -> tuple[jax.Array, MoeStats]:
        """x [B, T, D], valid [B, T] bool -> ([B, T, D], MoeStats)."""
        b, t, d = x.shape
        tokens = x.reshape(b * t, d)
        valid = valid.reshape(b * t)
        logits = jnp.dot(
            tokens.astype(jnp.float32), self.router.kernel[...].astype(jnp.float32)
        )  # [N, E]
        probs = jax.nn.softmax(logits, axis=-1)
        top_prob, top_index = jax.lax.top_k(probs, self.top_k)
        if self.norm_topk_prob:
            top_prob = top_prob / jnp.sum(top_prob, axis=-1, keepdims=True)
        routing = Routing(top_index.astype(jnp.int32), top_prob.astype(self.dtype), valid)
        dispatch = get_dispatch(self.dispatch_name)
        y, kept = dispatch(tokens, routing, self.experts.weights(self.dtype), self.capacity_factor)
        return y.reshape(b, t, d).astype(x.dtype), self._stats(logits, probs, routing, kept)

    def _stats(
        self, logits: jax.Array, probs: jax.Array, routing: Routing, kept: jax.Array
    ) -> MoeStats:
        weight = routing.valid.astype(jnp.float32)
        num_valid = jnp.maximum(jnp.sum(weight), 1.0)
        counts = (
            jnp.zeros((self.num_experts,), jnp.float32)
            .at[routing.expert_index.reshape(-1)]
            .add(jnp.repeat(weight, self.top_k))
        )
        assignments = num_valid * self.top_k
        tokens_per_expert = counts / num_valid
        mean_prob = jnp.sum(probs * weight[:, None], axis=0) / num_valid
        z = jax.nn.logsumexp(logits, axis=-1)
        valid_assignments = jnp.sum(weight) * self.top_k
        return MoeStats(
            load_balance_loss=self.num_experts * jnp.sum(tokens_per_expert * mean_prob),
            router_z_loss=jnp.sum(z * z * weight) / num_valid,
            expert_load=counts / assignments,
            dropped_fraction=(valid_assignments - kept) / assignments,
        )
