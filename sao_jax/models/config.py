"""Typed model configuration and named presets.

A `ModelConfig` fully determines parameter shapes and the forward computation. It is a frozen
dataclass so it can be hashed into jit caches and written to JSON next to checkpoints.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Literal

import jax.numpy as jnp

MoeDispatch = Literal["sorted_capacity", "ragged_dot", "expert_parallel"]

# Rematerialisation policies of a decoder layer's backward pass (`ModelConfig.remat`; the
# memory plan's `Workload.remat` takes the same names):
# - "none": no checkpoint; every intermediate of every layer lives until the backward pass.
# - "full": `jax.checkpoint` per layer, nothing saved: each layer's input is kept and the layer
#   is recomputed in the backward pass.
# - "dots_with_no_batch_dims": per-layer checkpoint saving the outputs of matmuls without batch
#   dimensions (`jax.checkpoint_policies.dots_with_no_batch_dims_saveable`): the q/k/v/o, router
#   and dense-MLP projections; attention scores and expert einsums (batched) are recomputed.
REMAT_POLICIES: tuple[str, ...] = ("none", "full", "dots_with_no_batch_dims")


@dataclasses.dataclass(frozen=True)
class LayerGroup:
    """A run of consecutive decoder layers of one kind, stacked under `scan_layers`.

    name: `{kind}_group{k}` (k counts groups of every kind in layer order), the group's
    parameter path under `layers/`; layers start..stop-1.
    """

    name: str
    is_moe: bool
    start: int
    stop: int

    @property
    def size(self) -> int:
        return self.stop - self.start


def check_remat(name: str, owner: str = "ModelConfig.remat") -> str:
    """`name` if it is one of `REMAT_POLICIES`, else a ValueError naming the choices."""
    if name not in REMAT_POLICIES:
        raise ValueError(f"{owner} must be one of {REMAT_POLICIES}, got {name!r}")
    return name


@dataclasses.dataclass(frozen=True)
class MoeAuxConfig:
    """Weights of the MoE auxiliary losses added to a training objective (`MoeAux.weighted_loss`):
    the learner's policy and critic losses, the behaviour-cloning warm start, `next_token_loss`.

    Attributes:
      load_balance_weight: weight of the Switch-style load-balancing loss.
      router_z_weight: weight of the router z-loss.
    """

    load_balance_weight: float = 1e-3
    router_z_weight: float = 1e-3

    def __post_init__(self):
        for name in ("load_balance_weight", "router_z_weight"):
            if not getattr(self, name) >= 0:
                raise ValueError(f"MoeAuxConfig.{name} must be >= 0, got {getattr(self, name)}")


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """Decoder-only MoE transformer (Qwen3-MoE family).

    Attributes:
      vocab_size: number of token ids (usually overridden from the tokenizer).
      d_model: residual stream width.
      num_layers: number of decoder layers.
      num_heads: query heads; num_kv_heads: key/value heads (grouped-query attention).
      head_dim: width of one attention head.
      num_experts: routed experts per MoE layer (0: every layer is dense).
      num_experts_per_token: top-k experts each token is sent to.
      moe_intermediate_size: hidden width of one SwiGLU expert.
      dense_intermediate_size: hidden width of the SwiGLU MLP in dense layers.
      dense_layers: indices of layers that use a dense MLP instead of MoE
        (Qwen3 `mlp_only_layers`, plus layers skipped by `decoder_sparse_step`).
      norm_topk_prob: renormalise the top-k router weights to sum to 1.
      qk_norm: RMSNorm over head_dim on queries and keys before RoPE (Qwen3).
      tie_embeddings: the LM head reuses the input embedding matrix.
      rope_theta: RoPE base frequency.
      rms_norm_eps: epsilon inside every RMSNorm.
      max_seq_len: longest position the model is meant to see (RoPE is not truncated).
      moe_dispatch: "sorted_capacity" (sort by expert + capacity-bounded grouped einsum; CPU
        default), "ragged_dot" (dropless sort + `jax.lax.ragged_dot`; GPU/TPU), or
        "expert_parallel" (shard_map + all-to-all; registered by a later module).
      capacity_factor: expert capacity = ceil(capacity_factor * tokens * top_k / num_experts)
        for "sorted_capacity"; <= 0 means dropless (capacity = tokens).
      initializer_range: stddev of the normal initialiser of projection weights.
      dtype: compute dtype of activations ("float32" or "bfloat16").
      param_dtype: storage dtype of parameters.
      scan_layers: stack consecutive layers of one kind (MoE / dense) into groups and run each
        group with `jax.lax.scan`, so compile time and program size do not grow with depth;
        parameters live at `layers/{kind}_group{k}/...` with a leading layer axis (False: one
        module per layer at `layers/{i}/...`, run in a Python loop).
      remat: rematerialisation policy of each layer's backward pass, one of `REMAT_POLICIES`
        ("none", "full", "dots_with_no_batch_dims"); applies with and without scan_layers.
      attention_query_block: causal self-attention without a KV cache (training, scoring)
        runs its queries in blocks of this many tokens, each against the keys up to its end
        only (`layers.attend_causal`: about half the score matrix; at most 8 blocks a row,
        longer rows take longer blocks); 0: the whole row at once. Same result up to float32
        rounding; decoding with a KV cache is unaffected.
    """

    vocab_size: int
    d_model: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    num_experts: int
    num_experts_per_token: int
    moe_intermediate_size: int
    dense_intermediate_size: int
    dense_layers: tuple[int, ...] = ()
    norm_topk_prob: bool = True
    qk_norm: bool = True
    tie_embeddings: bool = False
    rope_theta: float = 1_000_000.0
    rms_norm_eps: float = 1e-6
    max_seq_len: int = 4096
    moe_dispatch: MoeDispatch = "sorted_capacity"
    capacity_factor: float = 1.25
    initializer_range: float = 0.02
    dtype: str = "float32"
    param_dtype: str = "float32"
    scan_layers: bool = False
    remat: str = "none"
    attention_query_block: int = 64

    def __post_init__(self):
        positive = ("vocab_size", "d_model", "num_layers", "num_heads", "num_kv_heads", "head_dim")
        for name in positive:
            if getattr(self, name) <= 0:
                raise ValueError(f"ModelConfig.{name} must be positive, got {getattr(self, name)}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"ModelConfig.num_heads ({self.num_heads}) must be a multiple of "
                f"num_kv_heads ({self.num_kv_heads})"
            )
        if self.head_dim % 2:
            raise ValueError(f"ModelConfig.head_dim must be even for RoPE, got {self.head_dim}")
        if self.num_experts < 0:
            raise ValueError(f"ModelConfig.num_experts must be >= 0, got {self.num_experts}")
        if self.num_experts and not 0 < self.num_experts_per_token <= self.num_experts:
            raise ValueError(
                f"ModelConfig.num_experts_per_token must be in [1, num_experts={self.num_experts}],"
                f" got {self.num_experts_per_token}"
            )
        bad = [i for i in self.dense_layers if not 0 <= i < self.num_layers]
        if bad:
            raise ValueError(f"ModelConfig.dense_layers has indices outside [0, num_layers): {bad}")
        for name in ("dtype", "param_dtype"):
            if getattr(self, name) not in ("float32", "bfloat16", "float16"):
                raise ValueError(f"ModelConfig.{name} must be float32/bfloat16/float16")
        check_remat(self.remat)
        if self.attention_query_block < 0:
            raise ValueError(
                f"ModelConfig.attention_query_block must be >= 0 (0: the whole row), got "
                f"{self.attention_query_block}"
            )
        object.__setattr__(self, "dense_layers", tuple(sorted(set(self.dense_layers))))

    def is_moe_layer(self, layer: int) -> bool:
        """Whether decoder layer `layer` uses the routed MoE feed-forward."""
        return self.num_experts > 0 and layer not in self.dense_layers

    def layer_groups(self) -> tuple[LayerGroup, ...]:
        """Maximal runs of consecutive layers of the same kind, in layer order."""
        groups: list[LayerGroup] = []
        start = 0
        for layer in range(1, self.num_layers + 1):
            if layer == self.num_layers or self.is_moe_layer(layer) != self.is_moe_layer(start):
                moe = self.is_moe_layer(start)
                name = f"{'moe' if moe else 'dense'}_group{len(groups)}"
                groups.append(LayerGroup(name, moe, start, layer))
                start = layer
        return tuple(groups)

    @property
    def compute_dtype(self) -> jnp.dtype:
        return jnp.dtype(self.dtype)

    @property
    def params_dtype(self) -> jnp.dtype:
        return jnp.dtype(self.param_dtype)

    def replace(self, **changes: Any) -> ModelConfig:
        """A copy with `changes` applied (validated again)."""
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict; `ModelConfig(**d)` rebuilds it."""
        d = dataclasses.asdict(self)
        d["dense_layers"] = list(self.dense_layers)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ModelConfig:
        """Inverse of `to_dict`; unknown keys are an error."""
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(f"unknown ModelConfig fields: {unknown}")
        d = dict(d)
        if "dense_layers" in d:
            d["dense_layers"] = tuple(d["dense_layers"])
        return cls(**d)


_PRESETS: dict[str, ModelConfig] = {
    # Unit tests: the smallest MoE that still takes every routed path -- 4 experts with top-2
    # routing (weighted combine; capacity drops at the default capacity_factor), grouped-query
    # attention (2 query heads per KV head), two layers so per-layer state stacks. The model
    # has no shared expert; add `dense_layers=(1,)` to exercise the dense MLP.
    "test": ModelConfig(
        vocab_size=64,
        d_model=32,
        num_layers=2,
        num_heads=2,
        num_kv_heads=1,
        head_dim=16,
        num_experts=4,
        num_experts_per_token=2,
        moe_intermediate_size=32,
        dense_intermediate_size=64,
        tie_embeddings=True,
        rope_theta=10_000.0,
        max_seq_len=2048,
    ),
    # CPU demo: trains and samples in minutes on 2 cores.
    "tiny": ModelConfig(
        vocab_size=512,
        d_model=128,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        head_dim=32,
        num_experts=8,
        num_experts_per_token=2,
        moe_intermediate_size=128,
        dense_intermediate_size=512,
        tie_embeddings=True,
        rope_theta=10_000.0,
        max_seq_len=2048,
    ),
    # A laptop/single-accelerator research size (~100M total, ~25M active parameters).
    "small": ModelConfig(
        vocab_size=32_768,
        d_model=512,
        num_layers=6,
        num_heads=8,
        num_kv_heads=4,
        head_dim=64,
        num_experts=16,
        num_experts_per_token=2,
        moe_intermediate_size=512,
        dense_intermediate_size=2048,
        tie_embeddings=True,
        rope_theta=10_000.0,
        max_seq_len=4096,
    ),
    # Exact shapes of Qwen/Qwen3-30B-A3B (config.json of the HF release).
    "qwen3-30b-a3b": ModelConfig(
        vocab_size=151_936,
        d_model=2048,
        num_layers=48,
        num_heads=32,
        num_kv_heads=4,
        head_dim=128,
        num_experts=128,
        num_experts_per_token=8,
        moe_intermediate_size=768,
        dense_intermediate_size=6144,
        norm_topk_prob=True,
        tie_embeddings=False,
        rope_theta=1_000_000.0,
        max_seq_len=40_960,
        moe_dispatch="ragged_dot",
        dtype="bfloat16",
        param_dtype="bfloat16",
    ),
    # Exact shapes of Qwen/Qwen3-235B-A22B.
    "qwen3-235b-a22b": ModelConfig(
        vocab_size=151_936,
        d_model=4096,
        num_layers=94,
        num_heads=64,
        num_kv_heads=4,
        head_dim=128,
        num_experts=128,
        num_experts_per_token=8,
        moe_intermediate_size=1536,
        dense_intermediate_size=12_288,
        norm_topk_prob=True,
        tie_embeddings=False,
        rope_theta=1_000_000.0,
        max_seq_len=40_960,
        moe_dispatch="ragged_dot",
        dtype="bfloat16",
        param_dtype="bfloat16",
    ),
}

# The tiny model served with a 64K-token context (`python -m serving --config tiny_64k`):
# agents such as Hermes Agent refuse a model that advertises less than 64K positions.
# Same shapes and parameters as `tiny` (RoPE positions are not truncated, so only the
# advertised limit differs); the worker sizes its KV cache to the requests it serves.
_PRESETS["tiny_64k"] = dataclasses.replace(_PRESETS["tiny"], max_seq_len=65_536)


def preset_names() -> tuple[str, ...]:
    """Names accepted by `get_model_config`."""
    return tuple(_PRESETS)


def get_model_config(name: str, **overrides: Any) -> ModelConfig:
    """The named preset with `overrides` applied, e.g. `get_model_config("tiny", vocab_size=V)`."""
    if name not in _PRESETS:
        raise ValueError(f"unknown model preset {name!r}; known presets: {', '.join(_PRESETS)}")
    return _PRESETS[name].replace(**overrides) if overrides else _PRESETS[name]
