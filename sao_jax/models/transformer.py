"""Decoder-only MoE transformer (policy) and the backbone it shares with the critic.

Parameter paths are stable and readable, so optimisers and freezing rules can select them by
pattern: `embed/embedding`, `layers/3/attn/q_proj/kernel`, `layers/3/attn/q_norm/scale`,
`layers/3/moe/router/kernel`, `layers/3/moe/experts/gate_proj`, `layers/1/mlp/up_proj/kernel`
(dense layers), `final_norm/scale`, `lm_head/kernel` (untied only), `value_head/kernel` (critic).

With `ModelConfig.scan_layers`, consecutive layers of one kind are stacked into groups (see
`ModelConfig.layer_groups`) and every layer parameter gains a leading layer axis (logical axis
"layers", never sharded): `layers/moe_group0/attn/q_proj/kernel` [L, D, H*Dh],
`layers/moe_group0/moe/experts/gate_proj` [L, E, D, F], `layers/dense_group1/mlp/up_proj/kernel`.
The same path patterns select them (`(^|/)moe/`, `(^|/)attn/`); `stack_layer_params` and
`unstack_layer_params` convert between the two layouts.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx, struct

from sao_jax.models.config import LayerGroup, ModelConfig, check_remat
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
from sao_jax.models.logprobs import LOGPROB_CHUNK, chunked_token_logprobs, take_positions
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


LayerFn = Callable[
    [nnx.State, jax.Array, AttentionContext, LayerKV | None],
    tuple[jax.Array, tuple[LayerKV | None, MoeStats | None]],
]


def remat_policy(name: str) -> Callable[..., bool] | None:
    """The `jax.checkpoint` policy of a `ModelConfig.remat` name (None: save nothing).

    "none" has no policy: `layer_function` skips the checkpoint altogether.
    """
    check_remat(name)
    if name == "dots_with_no_batch_dims":
        return jax.checkpoint_policies.dots_with_no_batch_dims_saveable
    return None


def layer_function(graphdef: nnx.GraphDef, remat: str, *, prevent_cse: bool = True) -> LayerFn:
    """`f(layer_state, x, ctx, kv) -> (x, (kv, stats))`: one decoder layer as a pure function,
    under `jax.checkpoint` with the `remat` policy unless remat is "none"."""

    def apply(state, x, ctx, kv):
        y, new_kv, stats = nnx.merge(graphdef, state)(x, ctx, kv)
        return y, (new_kv, stats)

    if check_remat(remat) == "none":
        return apply
    return jax.checkpoint(apply, policy=remat_policy(remat), prevent_cse=prevent_cse)


def _stacked_layers(config: ModelConfig, group: LayerGroup, rngs: nnx.Rngs) -> DecoderLayer:
    """`group.size` DecoderLayers initialised at once (vmapped, one RNG split per layer) as one
    module whose parameters carry a leading "layers" axis."""

    @nnx.split_rngs(splits=group.size)
    @nnx.vmap(in_axes=(0,), out_axes=0)
    def create(rngs: nnx.Rngs) -> DecoderLayer:
        return DecoderLayer(config, group.start, rngs=rngs)

    stacked = create(rngs)
    for _, variable in nnx.iter_graph(stacked):
        if isinstance(variable, nnx.Variable) and variable.has_metadata("logical_axes"):
            axes = variable.get_metadata()["logical_axes"]
            variable.set_metadata("logical_axes", ("layers", *axes))
    return stacked


class ScannedLayers(nnx.Module):
    """Decoder layers stacked per `ModelConfig.layer_groups`, each group run by `lax.scan`.

    Attribute `{group.name}` is a DecoderLayer whose parameters have a leading layer axis.
    """

    def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs):
        self.groups = config.layer_groups()
        self.remat = config.remat
        for group in self.groups:
            setattr(self, group.name, _stacked_layers(config, group, rngs))

    def __len__(self) -> int:
        return self.groups[-1].stop

    def __call__(
        self, x: jax.Array, ctx: AttentionContext, kv_cache: Sequence[LayerKV] | None
    ) -> tuple[jax.Array, list[LayerKV], list[MoeStats]]:
        """Every group in order; per-layer caches are stacked per group for the scan (and
        unstacked again), so callers keep the looped path's per-layer cache tuples."""
        new_cache: list[LayerKV] = []
        stats: list[MoeStats] = []
        for group in self.groups:
            graphdef, state = nnx.split(getattr(self, group.name))
            # The scan's loop already keeps XLA from merging the recomputation into the forward
            # (what prevent_cse guards against); the JAX docs advise False under scan.
            fn = layer_function(graphdef, self.remat, prevent_cse=False)
            kv = None
            if kv_cache is not None:
                layers = kv_cache[group.start : group.stop]
                kv = (jnp.stack([k for k, _ in layers]), jnp.stack([v for _, v in layers]))

            def step(x, xs, fn=fn):
                layer_state, layer_kv = xs
                return fn(layer_state, x, ctx, layer_kv)

            x, (group_kv, group_stats) = jax.lax.scan(step, x, (state, kv))
            if group_kv is not None:
                new_cache += [(group_kv[0][j], group_kv[1][j]) for j in range(group.size)]
            if group_stats is not None:
                stats.append(group_stats)
        return x, new_cache, stats


class Backbone(nnx.Module):
    """Embedding, decoder layers and final norm: everything but the output head."""

    def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs):
        if config.num_experts:
            get_dispatch(config.moe_dispatch)  # an unknown dispatch fails before any allocation
        self.config = config
        self.embed = Embed(config, rngs=rngs)
        if config.scan_layers:
            self.layers = ScannedLayers(config, rngs=rngs)
        else:
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
        if isinstance(self.layers, ScannedLayers):
            x, new_cache, stacked_stats = self.layers(x, ctx, kv_cache)
            aux = MoeAux.from_stacked(stacked_stats)
        else:
            new_cache, stats = [], []
            for i, layer in enumerate(self.layers):
                layer_kv = None if kv_cache is None else kv_cache[i]
                if self.config.remat == "none":
                    x, layer_cache, layer_stats = layer(x, ctx, layer_kv)
                else:
                    graphdef, state = nnx.split(layer)
                    fn = layer_function(graphdef, self.config.remat)
                    x, (layer_cache, layer_stats) = fn(state, x, ctx, layer_kv)
                new_cache.append(layer_cache)
                if layer_stats is not None:
                    stats.append(layer_stats)
            aux = MoeAux.from_layers(stats)
        return ForwardOutput(
            hidden=self.final_norm(x),
            aux=aux,
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
        chunk_size: int = LOGPROB_CHUNK,
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


def _group_of(config: ModelConfig) -> dict[int, LayerGroup]:
    return {i: g for g in config.layer_groups() for i in range(g.start, g.stop)}


def stack_layer_params(config: ModelConfig, flat: Mapping[tuple, Any]) -> dict[tuple, Any]:
    """Flat {path: array} of the looped layout (`layers/{i}/...`) -> the scanned layout
    (`layers/{group}/...`, layers stacked on a new leading axis); other paths unchanged."""
    out: dict[tuple, Any] = {}
    per_group: dict[tuple, dict[int, Any]] = {}
    group_of = _group_of(config)
    for path, value in flat.items():
        if path[0] != "layers":
            out[path] = value
            continue
        group = group_of[int(path[1])]
        per_group.setdefault(("layers", group.name, *path[2:]), {})[int(path[1])] = value
    for group in config.layer_groups():
        for path, layers in per_group.items():
            if path[1] == group.name:
                out[path] = jnp.stack([layers[i] for i in range(group.start, group.stop)])
    return out


def unstack_layer_params(config: ModelConfig, flat: Mapping[tuple, Any]) -> dict[tuple, Any]:
    """Inverse of `stack_layer_params`: the scanned layout -> `layers/{i}/...`."""
    groups = {g.name: g for g in config.layer_groups()}
    out: dict[tuple, Any] = {}
    for path, value in flat.items():
        if path[0] != "layers":
            out[path] = value
            continue
        group = groups[path[1]]
        for j in range(group.size):
            out[("layers", group.start + j, *path[2:])] = value[j]
    return out


def with_scan_layers(model: Backbone, scan_layers: bool) -> Backbone:
    """The same model (same class and weights) in the looped or the scanned layout."""
    config = model.config
    if config.scan_layers == scan_layers:
        return model
    target = config.replace(scan_layers=scan_layers)
    flat = {path: v.get_value() for path, v in nnx.to_flat_state(nnx.state(model))}
    convert = stack_layer_params if scan_layers else unstack_layer_params
    values = convert(target if scan_layers else config, flat)
    graphdef, state = nnx.split(nnx.eval_shape(lambda: type(model)(target, rngs=nnx.Rngs(0))))
    for path, variable in nnx.to_flat_state(state):
        variable.set_value(values[path])
    return nnx.merge(graphdef, state)


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
