"""Decoder-only MoE transformer (policy) and the backbone it shares with the critic.

Parameter paths are stable and readable, so optimisers and freezing rules can select them by
pattern: `embed/embedding`, `layers/3/attn/q_proj/kernel`, `layers/3/attn/q_norm/scale`,
`layers/3/moe/router/kernel`, `layers/3/moe/experts/gate_proj`, `layers/1/mlp/up_proj/kernel`
(dense layers), `final_norm/scale`, `lm_head/kernel` (untied only), `value_head/kernel` (critic).
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import jax.numpy as jnp
from flax import nnx, struct

from sao_jax.models.config import ModelConfig
from sao_jax.models.layers import (
    MLP,
    Attention,
    AttentionContext,
    Embed,
    LayerKV,
    RMSNorm,
    attention_context,
    dense,
)
from sao_jax.models.logprobs import chunked_token_logprobs, take_positions
from sao_jax.models.moe import MoeAux, MoeBlock, MoeStats
from sao_jax.models.moe_dispatch import get_dispatch
from sao_jax.sharding import LogicalRules, init_sharded, one_off_compiler_options, shard


@struct.dataclass
class ForwardOutput:
    """hidden: [B, T, D] after the final norm; aux: MoE losses and router stats;
    kv_cache: per-layer (keys, values) [B, K, S, Dh] when a cache was passed in, else None."""

    hidden: jax.Array
    aux: MoeAux
    kv_cache: tuple[LayerKV, ...] | None


class DecoderLayer(nnx.Module):
    """Pre-norm block: x + attn(norm(x)), then x + ffn(norm(x)); ffn is MoE or dense SwiGLU."""

    def __init__(self, config: ModelConfig, layer: int, *, rngs: nnx.Rngs):
        norm = dict(eps=config.rms_norm_eps, param_dtype=config.params_dtype, logical_axis="norm")
        self.attn_norm = RMSNorm(config.d_model, **norm)
        self.attn = Attention(config, rngs=rngs)
        self.ffn_norm = RMSNorm(config.d_model, **norm)
        self.is_moe = config.is_moe_layer(layer)
        if self.is_moe:
            self.moe = MoeBlock(config, rngs=rngs)
        else:
            self.mlp = MLP(config, config.dense_intermediate_size, rngs=rngs)

    def __call__(
        self, x: jax.Array, ctx: AttentionContext, kv_cache: LayerKV | None
    ) -> tuple[jax.Array, LayerKV | None, MoeStats | None]:
        h, new_cache = self.attn(self.attn_norm(x), ctx, kv_cache)
        x = x + h
        y = self.ffn_norm(x)
        stats = None
        if self.is_moe:
            y, stats = self.moe(y, ctx.valid)
        else:
            y = self.mlp(y)
        return shard(x + y, ("batch", "length", "act_embed")), new_cache, stats


class Backbone(nnx.Module):
    """Embedding, decoder layers and final norm: everything but the output head."""

    def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs):
        if config.num_experts:
            get_dispatch(config.moe_dispatch)  # an unknown dispatch fails before any allocation
        self.config = config
        self.embed = Embed(config, rngs=rngs)
        self.layers = nnx.List(
            [DecoderLayer(config, i, rngs=rngs) for i in range(config.num_layers)]
        )
        self.final_norm = RMSNorm(
            config.d_model,
            eps=config.rms_norm_eps,
            param_dtype=config.params_dtype,
            logical_axis="norm",
        )

    def forward(
        self,
        input_ids: jax.Array,
        *,
        positions: jax.Array | None = None,
        segment_ids: jax.Array | None = None,
        kv_cache: Sequence[LayerKV] | None = None,
    ) -> ForwardOutput:
        """Run the backbone.

        Args:
          input_ids: [B, T] int32.
          positions: [B, T] RoPE positions (default 0..T-1; restart them per packed segment).
          segment_ids: [B, T] int32; tokens attend only within their segment, 0 marks padding
            (padding never changes other tokens' results, MoE statistics or capacity use).
          kv_cache: optional per-layer (keys, values) [B, K, S, Dh]; with a cache, row b's token
            t is written at slot positions[b, t] and attends to slots <= that position.
        Returns:
          ForwardOutput(hidden [B, T, D], aux, kv_cache).
        """
        b, t = input_ids.shape
        if positions is None:
            positions = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t))
        if segment_ids is None:
            segment_ids = jnp.ones((b, t), jnp.int32)
        if kv_cache is not None and len(kv_cache) != len(self.layers):
            raise ValueError(f"kv_cache has {len(kv_cache)} layers, model has {len(self.layers)}")
        ctx = attention_context(
            positions,
            segment_ids,
            head_dim=self.config.head_dim,
            rope_theta=self.config.rope_theta,
            cache_len=None if kv_cache is None else kv_cache[0][0].shape[2],
        )
        x = shard(self.embed(input_ids), ("batch", "length", "act_embed"))
        new_cache, stats = [], []
        for i, layer in enumerate(self.layers):
            x, layer_cache, layer_stats = layer(x, ctx, None if kv_cache is None else kv_cache[i])
            new_cache.append(layer_cache)
            if layer_stats is not None:
                stats.append(layer_stats)
        return ForwardOutput(
            hidden=self.final_norm(x),
            aux=MoeAux.from_layers(stats),
            kv_cache=None if kv_cache is None else tuple(new_cache),
        )


class Transformer(Backbone):
    """The policy: backbone + LM head (tied to the embedding or separate)."""

    def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs):
        super().__init__(config, rngs=rngs)
        if not config.tie_embeddings:
            self.lm_head = dense(
                config, config.d_model, config.vocab_size, ("embed", "vocab"), rngs=rngs
            )

    def unembedding(self) -> jax.Array:
        """The output projection [D, V] (the embedding transposed when tied)."""
        if self.config.tie_embeddings:
            return self.embed.embedding[...].T
        return self.lm_head.kernel[...]

    def logits(self, hidden: jax.Array) -> jax.Array:
        """hidden [..., D] -> float32 logits [..., V]. Materialises V per position."""
        w = self.unembedding().astype(hidden.dtype)
        logits = jnp.einsum("...d,dv->...v", hidden, w, preferred_element_type=jnp.float32)
        return shard(logits, ("batch", "length", "act_vocab")) if logits.ndim == 3 else logits

    def token_logprobs(
        self,
        hidden: jax.Array,
        targets: jax.Array,
        *,
        chunk_size: int = 256,
        temperature: float = 1.0,
        at: jax.Array | None = None,
    ) -> tuple[jax.Array, jax.Array]:
        """Log-probs of `targets` [B, T] and entropies from hidden [B, T, D], chunked over T.

        `at` [B, K] int: the head runs at those columns only (hidden and targets gathered
        there) and the results are [B, K]; None: at every column, [B, T].
        """
        if at is not None:
            hidden, targets = take_positions(hidden, at), take_positions(targets, at)
        return chunked_token_logprobs(
            hidden, self.unembedding(), targets, chunk_size=chunk_size, temperature=temperature
        )

    def __call__(
        self,
        input_ids: jax.Array,
        *,
        positions: jax.Array | None = None,
        segment_ids: jax.Array | None = None,
    ) -> jax.Array:
        """input_ids [B, T] int32 -> float32 logits [B, T, V]."""
        out = self.forward(input_ids, positions=positions, segment_ids=segment_ids)
        return self.logits(out.hidden)


def init_model(
    config: ModelConfig,
    *,
    seed: int = 0,
    mesh: jax.sharding.Mesh | None = None,
    rules: LogicalRules | None = None,
    model_class: type[Backbone] = Transformer,
) -> Backbone:
    """Initialise `model_class(config)` inside one jit (much faster than op-by-op on CPU).

    With a mesh, every parameter is created already sharded by its logical axes.
    """

    def factory() -> Backbone:
        return model_class(config, rngs=nnx.Rngs(seed))

    if mesh is not None:
        return init_sharded(factory, mesh, rules)
    graphdef, _ = nnx.split(nnx.eval_shape(factory))
    create = jax.jit(lambda: nnx.state(factory()), compiler_options=one_off_compiler_options())
    return nnx.merge(graphdef, create())
