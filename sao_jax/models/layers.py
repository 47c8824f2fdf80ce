"""Transformer building blocks: RMSNorm, embedding, RoPE, grouped-query attention, SwiGLU MLP.

Every parameter carries `logical_axes` metadata (read by `sao_jax.sharding`) and every key
activation passes through `sharding.shard`, so the same code runs on one CPU or a 4-axis mesh.
Shapes: B batch, T query tokens, S key slots (T without a KV cache), D d_model, H query heads,
K kv heads, Dh head_dim, F hidden width.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx, struct

from sao_jax.models.config import ModelConfig
from sao_jax.sharding import shard

# Finite, so rows with every key masked (padding queries) stay NaN-free.
_MASKED_SCORE = -1e30

LayerKV = tuple[jax.Array, jax.Array]


def _normal(config: ModelConfig, logical_axes: tuple[str | None, ...]):
    return nnx.with_metadata(
        nnx.initializers.normal(stddev=config.initializer_range), logical_axes=logical_axes
    )


def dense(
    config: ModelConfig,
    in_features: int,
    out_features: int,
    logical_axes: tuple[str | None, str | None],
    *,
    rngs: nnx.Rngs,
) -> nnx.Linear:
    """Bias-free projection `x @ kernel`, kernel [in, out] annotated with `logical_axes`."""
    return nnx.Linear(
        in_features,
        out_features,
        use_bias=False,
        dtype=config.compute_dtype,
        param_dtype=config.params_dtype,
        kernel_init=_normal(config, logical_axes),
        rngs=rngs,
    )


class RMSNorm(nnx.Module):
    """y = x / rms(x) * scale, normalised in float32 over the last dim (Qwen3 / T5 style)."""

    def __init__(self, dim: int, *, eps: float, param_dtype: jnp.dtype, logical_axis: str):
        self.scale = nnx.Param(jnp.ones((dim,), param_dtype), logical_axes=(logical_axis,))
        self.eps = eps

    def __call__(self, x: jax.Array) -> jax.Array:
        x32 = x.astype(jnp.float32)
        y = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)
        return y.astype(x.dtype) * self.scale[...].astype(x.dtype)


class Embed(nnx.Module):
    """Token embedding table [V, D]; also the tied LM head."""

    def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs):
        init = _normal(config, ("vocab", "embed"))
        self.embedding = nnx.Param(
            init(rngs.params(), (config.vocab_size, config.d_model), config.params_dtype)
        )
        self.dtype = config.compute_dtype

    def __call__(self, input_ids: jax.Array) -> jax.Array:
        """input_ids [B, T] int -> [B, T, D]."""
        return jnp.take(self.embedding[...], input_ids, axis=0).astype(self.dtype)


@struct.dataclass
class AttentionContext:
    """Per-forward attention inputs shared by every layer (computed once, not per layer).

    cos, sin: [B, T, Dh/2] RoPE tables; mask: [B, T, S] bool (S = T without a KV cache);
    positions: [B, T] cache slot of each token; valid: [B, T] False on padding.
    """

    cos: jax.Array
    sin: jax.Array
    mask: jax.Array
    positions: jax.Array
    valid: jax.Array


def attention_context(
    positions: jax.Array,
    segment_ids: jax.Array,
    *,
    head_dim: int,
    rope_theta: float,
    cache_len: int | None = None,
) -> AttentionContext:
    """RoPE tables and attention mask for [B, T] positions / segment ids (0 = padding).

    Without a cache, tokens attend causally within their segment. With a cache of `cache_len`
    slots, row b's token t attends to slots <= positions[b, t] (one sequence per row).
    """
    inv_freq = 1.0 / (rope_theta ** (jnp.arange(0, head_dim, 2, dtype=jnp.float32) / head_dim))
    angles = positions.astype(jnp.float32)[..., None] * inv_freq  # [B, T, Dh/2]
    valid = segment_ids != 0
    if cache_len is None:
        t = segment_ids.shape[1]
        causal = jnp.arange(t)[:, None] >= jnp.arange(t)[None, :]
        same = segment_ids[:, :, None] == segment_ids[:, None, :]
        mask = causal[None] & same & valid[:, :, None]
    else:
        slots = jnp.arange(cache_len)
        mask = (slots[None, None, :] <= positions[:, :, None]) & valid[:, :, None]
    return AttentionContext(jnp.cos(angles), jnp.sin(angles), mask, positions, valid)


def apply_rope(x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
    """Rotary embedding in the rotate-half layout of HF Llama/Qwen.

    Args:
      x: [B, T, N, Dh] queries or keys; cos, sin: [B, T, Dh/2] from `attention_context`.
    Returns:
      [B, T, N, Dh], same dtype as x.
    """
    cos, sin = cos[:, :, None, :], sin[:, :, None, :]
    x1, x2 = jnp.split(x.astype(jnp.float32), 2, axis=-1)
    rotated = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
    return rotated.astype(x.dtype)


def attend(q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array) -> jax.Array:
    """Grouped-query softmax attention, softmax in float32.

    The G query heads sharing a kv head are stacked along the query axis (`attend_stacked`), so
    K/V are read once and never repeated. `attend_repeated` (K/V repeated to every query head)
    gives the same result up to float32 rounding; `benchmarks/attention_layout.py` times the
    two. Which is faster depends on the CPU: on the Xeon measured last (2026-12-03) the stacked
    layout took 0.81-0.94x the repeated one's time for forward + backward at T = 128-512, on
    an earlier machine a prototype of the repeated one was 1.35x faster.

    Args:
      q: [B, T, H, Dh]; k, v: head-major [B, K, S, Dh] with H a multiple of K;
      mask: [B, T, S] bool.
    Returns:
      [B, T, H, Dh].
    """
    return attend_stacked(q, k, v, mask)


def attend_stacked(q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array) -> jax.Array:
    """`attend` with the G query heads sharing a kv head stacked along the query axis: both
    products are batched matmuls over (B, K) and K/V are never repeated."""
    b, t, h, dh = q.shape
    kv_heads, s = k.shape[1], k.shape[2]
    g = h // kv_heads
    qh = q.reshape(b, t, kv_heads, g, dh).transpose(0, 2, 3, 1, 4).reshape(b, kv_heads, g * t, dh)
    scores = jnp.einsum("bkqd,bksd->bkqs", qh, k, preferred_element_type=jnp.float32)
    mask = jnp.broadcast_to(mask[:, None, None], (b, 1, g, t, s)).reshape(b, 1, g * t, s)
    scores = jnp.where(mask, scores * dh**-0.5, _MASKED_SCORE)
    probs = jax.nn.softmax(scores, axis=-1).astype(v.dtype)
    out = jnp.einsum("bkqs,bksd->bkqd", probs, v)
    return out.reshape(b, kv_heads, g, t, dh).transpose(0, 3, 1, 2, 4).reshape(b, t, h, dh)


def attend_repeated(q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array) -> jax.Array:
    """`attend` with K/V repeated to every query head: one batched matmul per (B, H) whose
    query block is the whole row, at the cost of one copy of K/V. The layout `attend` does not
    use (see there); kept as the alternative the benchmark and the tests compare with."""
    h, dh = q.shape[2:]
    g = h // k.shape[1]
    k, v = jnp.repeat(k, g, axis=1), jnp.repeat(v, g, axis=1)  # head i reads kv head i // G
    scores = jnp.einsum("bthd,bhsd->bhts", q, k, preferred_element_type=jnp.float32)
    scores = jnp.where(mask[:, None], scores * dh**-0.5, _MASKED_SCORE)
    probs = jax.nn.softmax(scores, axis=-1).astype(v.dtype)
    return jnp.einsum("bhts,bhsd->bthd", probs, v)


# Longer rows take longer query blocks, so a row is never cut into more than this many (the
# program, unrolled per block, stays small at any length).
MAX_QUERY_BLOCKS = 8


def query_blocks(length: int, block: int) -> list[tuple[int, int]]:
    """The [start, end) query blocks `attend_causal` cuts a row of `length` tokens into: blocks
    of `block` tokens (the last may be shorter), lengthened where more than `MAX_QUERY_BLOCKS`
    would be needed; one block when `block` is 0 or at least the row."""
    if block < 0:
        raise ValueError(f"query block must be >= 0 (0: the whole row), got {block}")
    if block == 0 or block >= length:
        return [(0, length)]
    block = max(block, -(-length // MAX_QUERY_BLOCKS))
    return [(start, min(start + block, length)) for start in range(0, length, block)]


def attend_causal(
    q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array, block: int
) -> jax.Array:
    """`attend` for causal self-attention, in query blocks that skip the keys causality hides.

    With S = T and `mask[b, t, s]` False wherever s > t (what `attention_context` builds without
    a KV cache: causal within each segment), the queries [a, e) of a block can only see keys
    [0, e): each block attends to that prefix alone, and the score matrices of a row cover
    about half of T x T instead of all of it (blocks of 64: 63% at T = 224, 56% at 512). The
    result is `attend`'s up to float32 rounding. A mask that lets a token see a later one is
    not causal: its later keys would be dropped.

    Args:
      q: [B, T, H, Dh]; k, v: head-major [B, K, T, Dh]; mask: [B, T, T] bool, causal.
      block: query tokens per block (`query_blocks`; 0: one block, plain `attend`).
    Returns:
      [B, T, H, Dh].
    """
    blocks = query_blocks(q.shape[1], block)
    if len(blocks) == 1:
        return attend(q, k, v, mask)
    parts = [attend(q[:, a:e], k[:, :, :e], v[:, :, :e], mask[:, a:e, :e]) for a, e in blocks]
    return jnp.concatenate(parts, axis=1)


def write_kv(cache: jax.Array, new: jax.Array, positions: jax.Array, valid: jax.Array) -> jax.Array:
    """Write new keys/values into a per-row, head-major cache at their positions.

    Args:
      cache: [B, K, S, Dh]; new: [B, K, T, Dh]; positions: [B, T]; valid: [B, T] bool.
    Returns:
      the updated cache; invalid (padding) tokens write nothing.
    """
    slots = cache.shape[2]
    index = jnp.where(valid, positions, slots)  # out of range -> dropped
    rows = jnp.arange(cache.shape[0])[:, None]
    # Advanced indices (rows, index) broadcast to [B, T] and lead the update: [B, T, K, Dh].
    return cache.at[rows, :, index].set(new.transpose(0, 2, 1, 3).astype(cache.dtype), mode="drop")


class Attention(nnx.Module):
    """Grouped-query attention with RoPE and optional QK-norm (Qwen3)."""

    def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs):
        h, k, dh, d = config.num_heads, config.num_kv_heads, config.head_dim, config.d_model
        self.q_proj = dense(config, d, h * dh, ("embed", "heads"), rngs=rngs)
        self.k_proj = dense(config, d, k * dh, ("embed", "kv_heads"), rngs=rngs)
        self.v_proj = dense(config, d, k * dh, ("embed", "kv_heads"), rngs=rngs)
        self.o_proj = dense(config, h * dh, d, ("heads", "embed"), rngs=rngs)
        if config.qk_norm:
            norm = dict(eps=config.rms_norm_eps, param_dtype=config.params_dtype)
            self.q_norm = RMSNorm(dh, logical_axis="head_dim", **norm)
            self.k_norm = RMSNorm(dh, logical_axis="head_dim", **norm)
        self.num_heads, self.num_kv_heads, self.head_dim = h, k, dh
        self.qk_norm = config.qk_norm
        self.query_block = config.attention_query_block

    def __call__(
        self, x: jax.Array, ctx: AttentionContext, kv_cache: LayerKV | None = None
    ) -> tuple[jax.Array, LayerKV | None]:
        """Self-attention over the row, or over the row's KV cache when one is given.

        Args:
          x: [B, T, D]; ctx: from `attention_context` (its mask spans the cache if one is used).
          kv_cache: optional (keys, values), each [B, K, S, Dh]; token t of row b is written at
            slot ctx.positions[b, t] (padding writes nothing).
        Returns:
          ([B, T, D], updated cache or None).
        """
        b, t, _ = x.shape
        q = self.q_proj(x).reshape(b, t, self.num_heads, self.head_dim)
        k = self.k_proj(x).reshape(b, t, self.num_kv_heads, self.head_dim)
        v = self.v_proj(x).reshape(b, t, self.num_kv_heads, self.head_dim)
        if self.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        q = shard(apply_rope(q, ctx.cos, ctx.sin), ("batch", "length", "act_heads", None))
        # Keys and values head-major, the layout of the KV cache (no per-step transposes).
        k = apply_rope(k, ctx.cos, ctx.sin).transpose(0, 2, 1, 3)
        k = shard(k, ("batch", "act_kv_heads", "length", None))
        v = shard(v.transpose(0, 2, 1, 3), ("batch", "act_kv_heads", "length", None))
        if kv_cache is None:  # the row attends to itself, causally within each segment
            out, new_cache = attend_causal(q, k, v, ctx.mask, self.query_block), None
        else:
            k = write_kv(kv_cache[0], k, ctx.positions, ctx.valid)
            v = write_kv(kv_cache[1], v, ctx.positions, ctx.valid)
            out, new_cache = attend(q, k, v, ctx.mask), (k, v)
        out = shard(out, ("batch", "length", "act_heads", None))
        return self.o_proj(out.reshape(b, t, self.num_heads * self.head_dim)), new_cache


class MLP(nnx.Module):
    """Dense SwiGLU feed-forward: down(silu(gate(x)) * up(x))."""

    def __init__(self, config: ModelConfig, hidden: int, *, rngs: nnx.Rngs):
        d = config.d_model
        self.gate_proj = dense(config, d, hidden, ("embed", "mlp"), rngs=rngs)
        self.up_proj = dense(config, d, hidden, ("embed", "mlp"), rngs=rngs)
        self.down_proj = dense(config, hidden, d, ("mlp", "embed"), rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        """[B, T, D] -> [B, T, D]."""
        h = jax.nn.silu(self.gate_proj(x)) * self.up_proj(x)
        return self.down_proj(shard(h, ("batch", "length", "act_mlp")))
