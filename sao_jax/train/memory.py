"""Per-device memory of an RL run (SAO, PPO, GRPO, ...) on a mesh, computed from abstract shapes (no allocation).

It plans from the learner's config and algorithm, so it lives with the learner (not in
`sao_jax.distributed`, which the learner itself uses).

Parameters come from the real model classes (`nnx.eval_shape`), so every leaf is counted with
its dtype and the shard its logical axes give on the mesh. The learner holds, per device:

- policy parameters, and with an algorithm that trains a critic (`Algorithm.uses_critic`: SAO,
  PPO; not GRPO) the critic's (a copy of the backbone plus a value head);
- gradients of one model at a time (the policy step and the critic steps run one after another);
- optimizer state of the trainable leaves (policy, plus critic where there is one): AdamW's two
  float32 moments, plus a float32 master copy when parameters are stored in lower precision;
- activations kept for the backward pass of one step (formula in `activation_bytes`): the
  policy step's, or with a critic the larger of the policy's and the critic's (their scans
  run one after the other, so only one step's activations are alive at a time).

Rollout holds its published copy of the parameters and the KV cache (slots x context). With a
colocated plan one device group holds everything; a disaggregated plan has a train group and a
rollout group, each with its own mesh. A multi-host experiment samples on each host's own
chips (`experiments.alfworld_sao`: one engine per process): colocated, but its rollout terms
are laid out on a (data = hosts, fsdp = chips per host) mesh, i.e. a full copy per host.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Mapping, Sequence

import jax.numpy as jnp
from flax import nnx

from sao_jax.models import Critic, ModelConfig, Transformer
from sao_jax.models.config import REMAT_POLICIES as REMAT_POLICIES  # ModelConfig.remat's names
from sao_jax.models.config import check_remat
from sao_jax.models.logprobs import LOGPROB_CHUNK
from sao_jax.sharding import MESH_AXES, LogicalRules, logical_to_spec
from sao_jax.train.algorithms import get_algorithm
from sao_jax.train.config import LearnerConfig
from sao_jax.train.partition import compile_patterns, path_string

GIB = 1024**3


@dataclasses.dataclass(frozen=True)
class Workload:
    """What one learner step and the rollout hold at once (global sizes, not per device).

    Attributes:
      train_rows: rows per learner batch; seq_len: tokens per row.
      rollout_slots: concurrent sequences (KV-cache slots) over every rollout device;
      context: cache positions per slot.
      remat: the model's `ModelConfig.remat` (one of `REMAT_POLICIES`): "none" (every layer's
        intermediates live until the backward pass), "full" (per-layer rematerialisation:
        only each layer's input is kept, one layer is recomputed at a time) or
        "dots_with_no_batch_dims" (each layer's input and its unbatched matmul outputs kept).
      logprob_chunk: positions per chunk of the log-prob head (`LearnerConfig.logprob_chunk_size`).
    """

    train_rows: int = 64
    seq_len: int = 1024
    rollout_slots: int = 256
    context: int = 4096
    remat: str = "none"
    logprob_chunk: int = LOGPROB_CHUNK

    def __post_init__(self):
        for name in ("train_rows", "seq_len", "rollout_slots", "context", "logprob_chunk"):
            if getattr(self, name) < 1:
                raise ValueError(f"Workload.{name} must be >= 1, got {getattr(self, name)}")
        check_remat(self.remat, "Workload.remat")


@dataclasses.dataclass(frozen=True)
class MemoryTerm:
    name: str
    bytes: int
    note: str = ""


@dataclasses.dataclass(frozen=True)
class MemoryPlan:
    """Per-device bytes of one device group (its largest device) against its HBM budget."""

    group: str
    mesh: dict[str, int]
    terms: tuple[MemoryTerm, ...]
    hbm_bytes: int
    usable_fraction: float

    @property
    def total(self) -> int:
        return sum(t.bytes for t in self.terms)

    @property
    def budget(self) -> int:
        return int(self.hbm_bytes * self.usable_fraction)

    @property
    def fits(self) -> bool:
        return self.total <= self.budget

    def refusal(self) -> str | None:
        """None when it fits; else which term dominates and by how much the plan is over."""
        if self.fits:
            return None
        largest = max(self.terms, key=lambda t: t.bytes)
        return (
            f"{self.group}: needs {_gib(self.total)} per device, over the "
            f"{_gib(self.budget)} budget ({self.usable_fraction:.0%} of {_gib(self.hbm_bytes)} "
            f"HBM) by {_gib(self.total - self.budget)}; largest term: {largest.name} "
            f"{_gib(largest.bytes)}"
        )

    def table(self) -> str:
        """A text table of the terms (GiB per device)."""
        axes = " ".join(f"{k}={v}" for k, v in self.mesh.items())
        lines = [f"{self.group} (mesh {axes}), per device:"]
        width = max(len(t.name) for t in self.terms)
        for term in self.terms:
            lines.append(f"  {term.name:<{width}}  {term.bytes / GIB:9.2f} GiB  {term.note}")
        lines.append(
            f"  {'total':<{width}}  {self.total / GIB:9.2f} GiB  of {self.budget / GIB:.2f} GiB "
            f"usable ({self.usable_fraction:.0%} of {self.hbm_bytes / GIB:.0f} GiB HBM): "
            + ("fits" if self.fits else "DOES NOT FIT")
        )
        return "\n".join(lines)


def _gib(n: int) -> str:
    return f"{n / GIB:.2f} GiB"


def shard_elements(
    shape: Sequence[int],
    logical_axes: Sequence[str | None] | None,
    mesh: Mapping[str, int],
    rules: LogicalRules | None = None,
) -> int:
    """Elements of the largest shard of an array on a mesh of these axis sizes.

    Like `sao_jax.sharding.named_sharding`: a mesh axis splits a dim only if it divides it.
    """
    if logical_axes is None or len(logical_axes) != len(shape):
        return math.prod(shape)
    spec = logical_to_spec(logical_axes, rules)
    count = 1
    for dim, entry in zip(shape, tuple(spec) + (None,) * (len(shape) - len(spec)), strict=True):
        axes = () if entry is None else (entry,) if isinstance(entry, str) else tuple(entry)
        split = 1
        for axis in axes:
            if dim % (split * mesh.get(axis, 1)) == 0:
                split *= mesh.get(axis, 1)
        count *= dim // split
    return count


@dataclasses.dataclass(frozen=True)
class ParamLeaf:
    path: str
    shape: tuple[int, ...]
    dtype: jnp.dtype
    logical_axes: tuple[str | None, ...] | None


def abstract_params(config: ModelConfig, model_class=Transformer) -> tuple[ParamLeaf, ...]:
    """Every parameter of `model_class(config)` from `nnx.eval_shape` (nothing allocated;
    cached: tracing a 48-layer model takes seconds; `remat` changes no parameter)."""
    return _abstract_params(config.replace(remat="none"), model_class)


@functools.lru_cache(maxsize=8)
def _abstract_params(config: ModelConfig, model_class) -> tuple[ParamLeaf, ...]:
    abstract = nnx.eval_shape(lambda: model_class(config, rngs=nnx.Rngs(0)))
    leaves = []
    for path, variable in nnx.to_flat_state(nnx.state(abstract, nnx.Param)):
        value = variable.get_value()
        axes = variable.get_metadata().get("logical_axes")
        leaves.append(
            ParamLeaf(path_string(path), tuple(value.shape), jnp.dtype(value.dtype), axes)
        )
    return tuple(leaves)


def _bytes(
    leaves: Sequence[ParamLeaf],
    mesh: Mapping[str, int],
    rules: LogicalRules | None,
    bytes_per_element: float | None = None,
) -> int:
    return int(
        sum(
            shard_elements(leaf.shape, leaf.logical_axes, mesh, rules)
            * (leaf.dtype.itemsize if bytes_per_element is None else bytes_per_element)
            for leaf in leaves
        )
    )


def _trainable(leaves: Sequence[ParamLeaf], patterns: Sequence[str]) -> list[ParamLeaf]:
    compiled = compile_patterns(patterns)
    return [leaf for leaf in leaves if any(r.search(leaf.path) for r in compiled)]


def optimizer_bytes_per_element(param_dtype: jnp.dtype) -> int:
    """AdamW: two float32 moments, plus a float32 master copy below float32 precision."""
    return 8 + (4 if jnp.dtype(param_dtype).itemsize < 4 else 0)


def _fit(size: int, axes: Sequence[str], mesh: Mapping[str, int]) -> int:
    """How many ways `size` is split over `axes` (each kept only if it still divides)."""
    split = 1
    for axis in axes:
        if size % (split * mesh.get(axis, 1)) == 0:
            split *= mesh.get(axis, 1)
    return split


def activation_bytes(
    config: ModelConfig,
    workload: Workload,
    mesh: Mapping[str, int],
    rules: LogicalRules | None = None,
    *,
    value_head: bool = False,
) -> tuple[int, str]:
    """Bytes one device keeps for a training step's backward pass, and the policy stated.

    `value_head`: the critic's step (its head is a value per position, not a log-prob chunk).

    Per token and layer (c: compute-dtype bytes; heads and hidden widths divided by `tensor`
    where it divides them): norms and residual 4*D*c; q, k, v and their RoPE'd copies
    (2*H + 3*Kv)*Dh*c; attention scores (float32) and probabilities (c) over the row, H*T*(4+c)
    (no fused attention kernel: the [T, T] matrix per head is materialised); attention output
    and projection (H*Dh + D)*c; MoE: router logits and probabilities 2*E*4, and per routed row
    (K * max(capacity_factor, 1) rows per token) the expert buffer, gate, up, hidden and output
    (2*D + 3*F)*c, plus the top-k outputs K*D*c; a dense layer (3*F_dense + D)*c.
    "none" keeps every layer's share; "full" keeps each layer's input D*c and one layer's share;
    "dots_with_no_batch_dims" keeps, per layer, its input and the outputs of its unbatched
    matmuls, (D + H*Dh + 2*Kv*Dh + D)*c (q, k, v, o projections) plus the float32 router
    logits E*4 (MoE) or gate, up and down (2*F_dense + D)*c (dense), and one layer's share (the
    attention and expert einsums are batched, so they are recomputed). The head adds the final hidden D*c per token and one log-prob chunk (logits and their
    gradient, float32) of rows x chunk x V.
    """
    c = config.compute_dtype.itemsize
    batch_axes = logical_to_spec(("batch",), rules)[0]
    batch_axes = (
        () if batch_axes is None else (batch_axes,) if isinstance(batch_axes, str) else batch_axes
    )
    rows = math.ceil(workload.train_rows / _fit(workload.train_rows, batch_axes, mesh))
    t = workload.seq_len
    tokens = rows * t
    tensor = ("tensor",)
    heads = config.num_heads // _fit(config.num_heads, tensor, mesh)
    kv = config.num_kv_heads // _fit(config.num_kv_heads, tensor, mesh)
    d, dh = config.d_model, config.head_dim
    attention = 4 * d * c + (2 * heads + 3 * kv) * dh * c + heads * t * (4 + c)
    attention += (heads * dh + d) * c
    per_layer, saved_dots = [], []
    projections = (d + heads * dh + 2 * kv * dh + d) * c
    for layer in range(config.num_layers):
        if config.is_moe_layer(layer):
            f = config.moe_intermediate_size
            f //= _fit(f, tensor, mesh)
            routed = config.num_experts_per_token * max(config.capacity_factor, 1.0)
            ffn = 2 * config.num_experts * 4 + routed * (2 * d + 3 * f) * c
            ffn += config.num_experts_per_token * d * c
            saved_dots.append(projections + config.num_experts * 4)
        else:
            f = config.dense_intermediate_size
            f //= _fit(f, tensor, mesh)
            ffn = (3 * f + d) * c
            saved_dots.append(projections + (2 * f + d) * c)
        per_layer.append(attention + ffn)
    vocab = config.vocab_size // _fit(config.vocab_size, tensor, mesh)
    if value_head:  # the final hidden, then one float32 value (and its gradient) per token
        head = tokens * d * c + tokens * 4 * 2
    else:
        head = tokens * d * c + rows * min(workload.logprob_chunk, t) * vocab * 4 * 2
    if workload.remat == "none":
        kept = tokens * sum(per_layer)
        policy = "remat=none (every layer's intermediates kept)"
    elif workload.remat == "full":
        kept = tokens * (config.num_layers * d * c + max(per_layer))
        policy = "remat=full (layer inputs kept, one layer recomputed at a time)"
    else:
        kept = tokens * (sum(saved_dots) + max(per_layer))
        policy = (
            "remat=dots_with_no_batch_dims (layer inputs and projection outputs kept, "
            "one layer recomputed at a time)"
        )
    return int(kept + head), f"{policy}; {rows} rows x {t} tokens per device"


def kv_cache_bytes(
    config: ModelConfig, workload: Workload, mesh: Mapping[str, int], rules=None
) -> int:
    """Keys and values of every layer: slots x kv_heads x context x head_dim in the compute
    dtype, slots over the data-like axes and kv heads over `tensor` (the sampler's layout)."""
    shape = (workload.rollout_slots, config.num_kv_heads, workload.context, config.head_dim)
    per_layer = shard_elements(
        shape, ("cache_batch", "kv_heads", "cache_length", None), mesh, rules
    )
    return 2 * config.num_layers * per_layer * config.compute_dtype.itemsize


def plan_memory(
    config: ModelConfig,
    train_mesh: Mapping[str, int],
    workload: Workload,
    *,
    hbm_bytes: int,
    learner: LearnerConfig | None = None,
    rollout_mesh: Mapping[str, int] | None = None,
    rollout_colocated: bool = False,
    usable_fraction: float = 0.9,
    rules: LogicalRules | None = None,
) -> list[MemoryPlan]:
    """Per-device memory plans: one colocated group, or [train, rollout] with `rollout_mesh`.

    `rollout_colocated`: the rollout shares the training devices but its copy and cache are
    laid out on `rollout_mesh` (per-host sampling meshes): one colocated plan.

    `learner` (default `LearnerConfig()`, SAO): its algorithm decides whether the critic is
    counted (params, optimizer state, activations) and its trainable patterns which leaves
    carry optimizer state.

    `usable_fraction` of HBM is the budget (the rest: XLA's program, scratch and
    fragmentation).
    """
    learner = LearnerConfig() if learner is None else learner
    for name, mesh in (("train", train_mesh), ("rollout", rollout_mesh or {})):
        unknown = sorted(set(mesh) - set(MESH_AXES))
        if unknown:
            raise ValueError(f"{name} mesh has unknown axes {unknown}; axes are {MESH_AXES}")
    policy = abstract_params(config)
    train = [
        MemoryTerm("policy params", _bytes(policy, train_mesh, rules), str(config.param_dtype))
    ]
    opt_per_element = optimizer_bytes_per_element(config.params_dtype)
    policy_trainable = _trainable(policy, learner.policy_trainable)
    grads = _bytes(policy_trainable, train_mesh, rules)
    optimizer = _bytes(policy_trainable, train_mesh, rules, opt_per_element)
    uses_critic = get_algorithm(learner.algorithm).uses_critic
    if uses_critic:
        critic = abstract_params(config, Critic)
        critic_trainable = _trainable(critic, learner.critic_trainable)
        train.append(
            MemoryTerm("critic params", _bytes(critic, train_mesh, rules), "backbone + value head")
        )
        grads = max(grads, _bytes(critic_trainable, train_mesh, rules))
        optimizer += _bytes(critic_trainable, train_mesh, rules, opt_per_element)
    master = " + f32 master" if opt_per_element == 12 else ""
    models = "policy + critic" if uses_critic else "policy only"
    train += [
        MemoryTerm("gradients", grads, "one model at a time" if uses_critic else "policy"),
        MemoryTerm(
            "optimizer state",
            optimizer,
            f"AdamW 2 x f32 moments{master}, trainable ({models})",
        ),
    ]
    activations, note = activation_bytes(config, workload, train_mesh, rules)
    if uses_critic:
        critic_activations, _ = activation_bytes(
            config, workload, train_mesh, rules, value_head=True
        )
        larger = "critic" if critic_activations > activations else "policy"
        activations = max(activations, critic_activations)
        note += f"; policy or critic step, one at a time ({larger} larger)"
    else:
        note += "; policy step (no critic)"
    train.append(MemoryTerm("activations", activations, note))
    rollout_on = train_mesh if rollout_mesh is None else rollout_mesh
    rollout = [
        MemoryTerm(
            "rollout params",
            _bytes(policy, rollout_on, rules),
            "published copy, whole on each host" if rollout_colocated else "published copy",
        ),
        MemoryTerm(
            "KV cache",
            kv_cache_bytes(config, workload, rollout_on, rules),
            f"{workload.rollout_slots} slots x {workload.context} positions",
        ),
    ]
    if rollout_colocated and rollout_mesh is None:
        raise ValueError("rollout_colocated needs the rollout_mesh the samplers use")
    if rollout_mesh is None or rollout_colocated:
        where = " (colocated, sampling on each host's chips)" if rollout_colocated else ""
        return [
            MemoryPlan(
                f"train + rollout{where or ' (colocated)'}",
                dict(train_mesh),
                tuple(train + rollout),
                hbm_bytes,
                usable_fraction,
            )
        ]
    return [
        MemoryPlan("train", dict(train_mesh), tuple(train), hbm_bytes, usable_fraction),
        MemoryPlan("rollout", dict(rollout_mesh), tuple(rollout), hbm_bytes, usable_fraction),
    ]
