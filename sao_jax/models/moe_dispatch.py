"""MoE token dispatch: how routed tokens reach their experts and come back.

Every implementation has the same signature (`DispatchFn`) and is chosen by name through
`ModelConfig.moe_dispatch`, so a new one (e.g. "expert_parallel": shard_map + all-to-all over
the `expert` mesh axis) only has to `register_dispatch` itself.

Both built-in implementations sort the N*K (token, expert) assignments by expert, so their
cost grows with top-k, not with the number of experts:
- "sorted_capacity": each expert gets a fixed buffer of C rows and one grouped einsum runs over
  [E, C, D]; assignments past an expert's capacity are dropped (reported). Fast on CPU. With
  capacity_factor <= 0 it is dropless: balanced buffers plus a second pass over the overflow.
- "ragged_dot": dropless; `jax.lax.ragged_dot` over the sorted rows (GPU/TPU kernels; on CPU
  XLA densifies it, so it costs as much as running every expert).
Shapes: N tokens, K top-k, E experts, D d_model, F expert hidden width, A = N*K assignments.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import jax
import jax.numpy as jnp
from flax import struct

from sao_jax.sharding import shard


@struct.dataclass
class Routing:
    """Router decisions: expert_index [N, K] int32, expert_weight [N, K], valid [N] bool."""

    expert_index: jax.Array
    expert_weight: jax.Array
    valid: jax.Array


@struct.dataclass
class ExpertWeights:
    """SwiGLU expert weights: gate, up [E, D, F]; down [E, F, D]."""

    gate: jax.Array
    up: jax.Array
    down: jax.Array

    @property
    def num_experts(self) -> int:
        return self.gate.shape[0]


# (x [N, D], routing, weights, capacity_factor) -> (y [N, D], kept assignments [] int32)
DispatchFn = Callable[[jax.Array, Routing, ExpertWeights, float], tuple[jax.Array, jax.Array]]

_DISPATCH: dict[str, DispatchFn] = {}


def register_dispatch(name: str, fn: DispatchFn) -> None:
    """Make `fn` selectable as `ModelConfig(moe_dispatch=name)`."""
    _DISPATCH[name] = fn


def get_dispatch(name: str) -> DispatchFn:
    """The dispatch registered under `name`; a clear error if there is none."""
    if name not in _DISPATCH:
        raise ValueError(
            f"MoE dispatch {name!r} is not registered (available: {sorted(_DISPATCH)}); "
            "import the module that registers it before building the model"
        )
    return _DISPATCH[name]


def expert_capacity(num_tokens: int, top_k: int, num_experts: int, capacity_factor: float) -> int:
    """Rows per expert buffer: ceil(factor * N * K / E), at most N; factor <= 0 -> N (dropless).

    An expert can receive at most N assignments (top-k picks distinct experts), so C = N never
    drops anything.
    """
    if capacity_factor <= 0:
        return num_tokens
    return max(1, min(num_tokens, math.ceil(capacity_factor * num_tokens * top_k / num_experts)))


def _sort_by_expert(routing: Routing, num_experts: int):
    """Sort the A assignments by expert; padding tokens go to a virtual expert E at the end.

    Returns (order [A], sorted_expert [A], rank_in_expert [A], counts [E + 1]).
    """
    flat = jnp.where(routing.valid[:, None], routing.expert_index, num_experts).reshape(-1)
    order = jnp.argsort(flat, stable=True)
    sorted_expert = flat[order]
    counts = jnp.zeros((num_experts + 1,), jnp.int32).at[flat].add(1)
    starts = jnp.cumsum(counts) - counts
    rank = jnp.arange(flat.shape[0], dtype=jnp.int32) - starts[sorted_expert]
    return order, sorted_expert, rank, counts


def _combine(y_assign: jax.Array, routing: Routing) -> jax.Array:
    """[A, D] expert outputs in assignment order -> [N, D] router-weighted sum over K."""
    n, k = routing.expert_index.shape
    y = y_assign.reshape(n, k, -1)
    return jnp.einsum("nkd,nk->nd", y, routing.expert_weight.astype(y.dtype))


def grouped_swiglu(buffer: jax.Array, weights: ExpertWeights) -> jax.Array:
    """[E, C, D] per-expert rows -> [E, C, D] through each expert's SwiGLU."""
    gate = jnp.einsum("ecd,edf->ecf", buffer, weights.gate)
    up = jnp.einsum("ecd,edf->ecf", buffer, weights.up)
    h = shard(jax.nn.silu(gate) * up, ("act_experts", "capacity", "act_mlp"))
    return jnp.einsum("ecf,efd->ecd", h, weights.down)


def _to_slots(x: jax.Array, order: jax.Array, slot: jax.Array, num_slots: int, k: int) -> jax.Array:
    """Rows of x placed at `slot` of each sorted assignment -> [num_slots, D] (empty slots 0).

    Built by gather (which token sits in each slot) rather than by scattering rows.
    """
    n = x.shape[0]
    slot_token = jnp.full((num_slots,), n, jnp.int32).at[slot].set(order // k, mode="drop")
    return jnp.take(x, slot_token, axis=0, mode="fill", fill_value=0)


def _from_slots(out: jax.Array, order: jax.Array, slot: jax.Array) -> jax.Array:
    """[num_slots, D] expert outputs -> [A, D] in assignment order (dropped ones 0)."""
    slot_of_assignment = jnp.zeros_like(slot).at[order].set(slot)
    return jnp.take(out, slot_of_assignment, axis=0, mode="fill", fill_value=0)


def overflow_block_size(capacity: int) -> int:
    """Rows per block for assignments past the first-pass capacity: a power of two near C/4.

    Overflow per expert is small (a fraction of C) when routing is roughly balanced.
    """
    return int(2 ** max(1, math.floor(math.log2(max(capacity // 4, 2)))))


def _overflow_blocks(
    x: jax.Array,
    order: jax.Array,
    sorted_expert: jax.Array,
    rank: jax.Array,
    counts: jax.Array,
    capacity: int,
    weights: ExpertWeights,
) -> jax.Array:
    """Assignments ranked >= capacity within their expert, padded to whole blocks per expert,
    one block per loop step -> [A, D] (0 elsewhere)."""
    d = x.shape[1]
    e = weights.num_experts
    a = order.shape[0]
    k = a // x.shape[0]
    most = a - capacity  # an overflowing expert has filled its capacity first
    b = overflow_block_size(capacity)
    max_blocks = (most + min(e, most) * (b - 1)) // b  # bounds sum_e ceil(overflow_e / b)
    if max_blocks == 0:
        return jnp.zeros((a, d), x.dtype)
    overflow = jnp.maximum(counts[:e] - capacity, 0)
    blocks_per_expert = (overflow + b - 1) // b
    block_end = jnp.cumsum(blocks_per_expert)
    first_block = block_end - blocks_per_expert
    expert = jnp.minimum(sorted_expert, e - 1)
    over_rank = rank - capacity
    spilled = (sorted_expert < e) & (over_rank >= 0)
    slot = jnp.where(
        spilled, (first_block[expert] + over_rank // b) * b + over_rank % b, max_blocks * b
    )
    blocks = _to_slots(x, order, slot, max_blocks * b, k).reshape(max_blocks, b, d)
    block_ids = jnp.arange(max_blocks)
    # Owner of block j: experts whose blocks end at or before j (jnp.searchsorted would lower
    # to a sequential while loop on CPU).
    owner = jnp.sum(block_end[None, :] <= block_ids[:, None], axis=1)
    owner = jnp.minimum(owner, e - 1).astype(jnp.int32)

    out = _run_blocks(blocks, owner, block_end[-1], weights)
    return _from_slots(out.reshape(max_blocks * b, d), order, slot)


def _block_swiglu(rows: jax.Array, expert: jax.Array, weights: ExpertWeights) -> jax.Array:
    """[b, D] rows through expert `expert` (a traced index) -> [b, D]."""
    h = jax.nn.silu(rows @ weights.gate[expert]) * (rows @ weights.up[expert])
    return h @ weights.down[expert]


def _run_blocks_scan(
    blocks: jax.Array, owner: jax.Array, num_used: jax.Array, weights: ExpertWeights
) -> jax.Array:
    """Differentiable: a scan over every block slot, unused ones skipped by lax.cond.

    Each block is rematerialised in the backward pass (`jax.checkpoint`): the scan then saves
    only its inputs, not every slot's [b, F] hidden states, whose stacked copies (sized for
    the worst case, whatever the routing) were a large part of a training step's peak memory.
    """

    @jax.checkpoint
    def block(rows, expert):
        return _block_swiglu(rows, expert, weights)

    def one_block(_, inputs):
        rows, expert, used = inputs
        out = jax.lax.cond(used, lambda r: block(r, expert), jnp.zeros_like, rows)
        return None, out

    used = jnp.arange(blocks.shape[0]) < num_used
    return jax.lax.scan(one_block, None, (blocks, owner, used))[1]


@jax.custom_vjp
def _run_blocks(
    blocks: jax.Array, owner: jax.Array, num_used: jax.Array, weights: ExpertWeights
) -> jax.Array:
    """[max_blocks, b, D] -> [max_blocks, b, D]: block j through expert owner[j], j < num_used.

    The forward pass loops over the used blocks only (a while loop: no per-slot overhead, which
    dominates decode steps); gradients come from the equivalent scan, since reverse-mode AD
    cannot go through a while loop.
    """

    def body(j, out):
        return out.at[j].set(_block_swiglu(blocks[j], owner[j], weights))

    return jax.lax.fori_loop(0, num_used, body, jnp.zeros_like(blocks))


def _run_blocks_fwd(blocks, owner, num_used, weights):
    return _run_blocks(blocks, owner, num_used, weights), (blocks, owner, num_used, weights)


def _run_blocks_bwd(residuals, cotangent):
    blocks, owner, num_used, weights = residuals
    _, vjp = jax.vjp(lambda x, w: _run_blocks_scan(x, owner, num_used, w), blocks, weights)
    d_blocks, d_weights = vjp(cotangent)
    return d_blocks, None, None, d_weights


_run_blocks.defvjp(_run_blocks_fwd, _run_blocks_bwd)


def sorted_capacity(
    x: jax.Array, routing: Routing, weights: ExpertWeights, capacity_factor: float
) -> tuple[jax.Array, jax.Array]:
    """Sort by expert, fill [E, C, D] buffers, one grouped einsum; overflow is dropped.

    capacity_factor <= 0 is dropless: the buffers take C = ceil(A / E) rows per expert and the
    few assignments past that run in a second pass of per-expert blocks, instead of C = N,
    which would cost as much as running every expert on every token.
    """
    n, d = x.shape
    k = routing.expert_index.shape[1]
    e = weights.num_experts
    dropless = capacity_factor <= 0
    if dropless:  # the balanced share; >= 2 so decode steps rarely need the second pass
        c = min(n, max(2, math.ceil(n * k / e)))
    else:
        c = expert_capacity(n, k, e, capacity_factor)
    order, sorted_expert, rank, counts = _sort_by_expert(routing, e)
    keep = (rank < c) & (sorted_expert < e)
    slot = jnp.where(keep, sorted_expert * c + rank, e * c)  # e * c: nowhere (dropped)
    buffer = _to_slots(x, order, slot, e * c, k).reshape(e, c, d)
    buffer = shard(buffer, ("act_experts", "capacity", "act_embed"))
    out = grouped_swiglu(buffer, weights).reshape(e * c, d)
    y_assign = _from_slots(out, order, slot)
    if not dropless or c == n:  # C = N: nothing can overflow
        return _combine(y_assign, routing), jnp.sum(keep, dtype=jnp.int32)
    y_assign = y_assign + _overflow_blocks(x, order, sorted_expert, rank, counts, c, weights)
    return _combine(y_assign, routing), jnp.sum(sorted_expert < e, dtype=jnp.int32)


def ragged_dot(
    x: jax.Array, routing: Routing, weights: ExpertWeights, capacity_factor: float
) -> tuple[jax.Array, jax.Array]:
    """Dropless: sorted rows through `jax.lax.ragged_dot` with per-expert group sizes."""
    del capacity_factor  # dropless
    k = routing.expert_index.shape[1]
    e = weights.num_experts
    order, sorted_expert, _, counts = _sort_by_expert(routing, e)
    rows = jnp.take(x, order // k, axis=0)
    group_sizes = counts[:e]
    gate = jax.lax.ragged_dot(rows, weights.gate, group_sizes)
    up = jax.lax.ragged_dot(rows, weights.up, group_sizes)
    out = jax.lax.ragged_dot(jax.nn.silu(gate) * up, weights.down, group_sizes)
    valid = (sorted_expert < e)[:, None]
    out = jnp.where(valid, out, 0)  # rows of padding tokens sit past every group
    y_assign = jnp.zeros_like(out).at[order].set(out)
    return _combine(y_assign, routing), jnp.sum(valid, dtype=jnp.int32)


register_dispatch("sorted_capacity", sorted_capacity)
register_dispatch("ragged_dot", ragged_dot)
