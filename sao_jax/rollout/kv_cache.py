"""Preallocated per-slot KV cache for the sampler.

One row ("slot") holds one sequence: token at position p lives at slot index p, so slots can be
refilled independently (continuous batching) and positions never need left-padding shifts.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct

from sao_jax.models.config import ModelConfig
from sao_jax.models.layers import LayerKV
from sao_jax.sharding import named_sharding

CACHE_AXES = ("cache_batch", "kv_heads", "cache_length", "head_dim")


@struct.dataclass
class KVCache:
    """keys, values: per-layer head-major [B, K, S, Dh] arrays (B slots, S positions per slot)."""

    keys: tuple[jax.Array, ...]
    values: tuple[jax.Array, ...]

    @property
    def num_slots(self) -> int:
        return self.keys[0].shape[0]

    @property
    def length(self) -> int:
        return self.keys[0].shape[2]

    def layers(self) -> tuple[LayerKV, ...]:
        """Per-layer (keys, values) pairs, the form `Backbone.forward(kv_cache=...)` takes."""
        return tuple(zip(self.keys, self.values, strict=True))

    @classmethod
    def from_layers(cls, layers: tuple[LayerKV, ...]) -> KVCache:
        return cls(keys=tuple(k for k, _ in layers), values=tuple(v for _, v in layers))

    def take_slots(self, slots: jax.Array, length: int | None = None) -> KVCache:
        """Rows `slots` [n] of every layer (a sub-cache of n slots), optionally only their
        first `length` positions (a window a prefill whose tokens all sit below it needs)."""
        length = self.length if length is None else length
        take = lambda x: jnp.take(x[:, :, :length], slots, axis=0, mode="clip")  # noqa: E731
        return jax.tree.map(take, self)

    def put_slots(self, slots: jax.Array, sub: KVCache) -> KVCache:
        """Write sub-cache rows back at `slots` (a shorter sub-cache: at their first
        `sub.length` positions); out-of-range slots write nothing."""
        length = sub.length
        put = lambda x, y: x.at[slots, :, :length].set(y, mode="drop")  # noqa: E731
        return jax.tree.map(put, self, sub)


def init_kv_cache(config: ModelConfig, num_slots: int, length: int) -> KVCache:
    """A zero cache of `num_slots` x `length` positions in the model's compute dtype."""
    shape = (num_slots, config.num_kv_heads, length, config.head_dim)
    zeros = tuple(jnp.zeros(shape, config.compute_dtype) for _ in range(config.num_layers))
    return KVCache(keys=zeros, values=tuple(jnp.zeros_like(z) for z in zeros))


def kv_cache_shardings(
    config: ModelConfig, num_slots: int, length: int, mesh: jax.sharding.Mesh
) -> KVCache:
    """NamedShardings of a cache built by `init_kv_cache` (slots over data axes, heads over
    tensor)."""
    shape = (num_slots, config.num_kv_heads, length, config.head_dim)
    one = named_sharding(mesh, CACHE_AXES, shape)
    layers = tuple(one for _ in range(config.num_layers))
    return KVCache(keys=layers, values=layers)
