"""Expert parallelism: MoE dispatch across the `expert` mesh axis with shard_map + all-to-all.

Registered as `ModelConfig(moe_dispatch="expert_parallel")`. Each device of the `expert` axis
holds E / ep experts and a 1/ep slice of the tokens. Per layer:

    route locally -> pack each destination device's rows into a [ep, C, D] send buffer
    -> all_to_all over `expert` (rows travel to the device holding their expert)
    -> local experts (the single-device dispatch, dropless, over the rows received)
    -> all_to_all back -> weighted sum over the top-k, in each token's home device.

C is the capacity per destination device: ceil(capacity_factor * n * K / ep) for n local
tokens (assignments past it are dropped and counted), or, with capacity_factor <= 0, the most
any one device can receive (n * min(K, E / ep)), which never drops. Expert weights enter the
shard_map split over `expert` (and their hidden width over `tensor`, whose partial products are
summed); their model dimension is gathered over `fsdp` on the way in, as FSDP does.

Outside a mesh, or on a mesh whose `expert` axis has size 1, this falls back to the
single-device dispatch, so a model config can name it unconditionally.
Shapes: N tokens, K top-k, E experts, D d_model, F expert hidden width.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec

from sao_jax.models.moe_dispatch import ExpertWeights, Routing, get_dispatch, register_dispatch
from sao_jax.sharding import current_rules

EXPERT_AXIS = "expert"
TENSOR_AXIS = "tensor"


def local_dispatch_name() -> str:
    """The dispatch each device runs over its own experts: `ragged_dot` on accelerators (their
    grouped-matmul kernels), `sorted_capacity` on CPU (where ragged_dot densifies)."""
    return "sorted_capacity" if jax.default_backend() == "cpu" else "ragged_dot"


def destination_capacity(
    num_tokens: int, top_k: int, num_shards: int, experts_per_shard: int, capacity_factor: float
) -> int:
    """Rows each device may send to one destination device of the expert axis.

    capacity_factor <= 0: n * min(K, E / ep), the most one destination can receive (dropless).
    """
    most = num_tokens * min(top_k, experts_per_shard)
    if capacity_factor <= 0:
        return most
    return max(1, min(most, math.ceil(capacity_factor * num_tokens * top_k / num_shards)))


def _token_axes(mesh) -> tuple[str, ...]:
    """Mesh axes the tokens are split over: the `batch` rule's axes (size > 1) plus `expert`."""
    rule = dict(current_rules()).get("batch")
    axes = () if rule is None else (rule,) if isinstance(rule, str) else tuple(rule)
    axes = tuple(a for a in axes if a in mesh.axis_names and mesh.shape[a] > 1)
    return axes if EXPERT_AXIS in axes else (*axes, EXPERT_AXIS)


def expert_parallel(
    x: jax.Array, routing: Routing, weights: ExpertWeights, capacity_factor: float
) -> tuple[jax.Array, jax.Array]:
    """`DispatchFn` over the `expert` axis of the current mesh (`jax.set_mesh`).

    Args:
      x: [N, D] tokens; routing: expert_index / expert_weight [N, K], valid [N];
      weights: gate, up [E, D, F], down [E, F, D]; capacity_factor: see the module docstring.
    Returns:
      (y [N, D], kept assignments summed over every device [] int32).
    """
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty or EXPERT_AXIS not in mesh.axis_names or mesh.shape[EXPERT_AXIS] == 1:
        return get_dispatch(local_dispatch_name())(x, routing, weights, capacity_factor)
    ep = mesh.shape[EXPERT_AXIS]
    e = weights.num_experts
    if e % ep:
        raise ValueError(
            f"expert_parallel: {e} experts do not split evenly over an expert axis of {ep} devices"
        )
    token_axes = _token_axes(mesh)
    shards = math.prod(mesh.shape[a] for a in token_axes)
    n = x.shape[0]
    padded = -(-n // shards) * shards  # tokens split evenly; padding rows are invalid
    if padded != n:
        pad = padded - n
        x = jnp.pad(x, ((0, pad), (0, 0)))
        routing = Routing(
            jnp.pad(routing.expert_index, ((0, pad), (0, 0))),
            jnp.pad(routing.expert_weight, ((0, pad), (0, 0))),
            jnp.pad(routing.valid, (0, pad)),
        )
    f = weights.gate.shape[2]
    tensor = (
        TENSOR_AXIS
        if TENSOR_AXIS in mesh.axis_names
        and mesh.shape[TENSOR_AXIS] > 1
        and f % mesh.shape[TENSOR_AXIS] == 0
        else None
    )
    rows = PartitionSpec(token_axes)
    in_specs = (
        PartitionSpec(token_axes, None),
        Routing(rows, rows, rows),
        ExpertWeights(
            gate=PartitionSpec(EXPERT_AXIS, None, tensor),
            up=PartitionSpec(EXPERT_AXIS, None, tensor),
            down=PartitionSpec(EXPERT_AXIS, tensor, None),
        ),
    )

    def per_device(x, routing, weights):
        if tensor is not None:  # tokens meet weights that differ per tensor shard
            x = jax.lax.pcast(x, (tensor,), to="varying")
        y, kept = _exchange(x, routing, weights, ep, capacity_factor)
        if tensor is not None:  # each tensor shard computed a slice of F: sum the products
            y = jax.lax.psum(y, tensor)
        return y, jax.lax.psum(kept, token_axes)

    y, kept = jax.shard_map(
        per_device,
        in_specs=in_specs,
        out_specs=(PartitionSpec(token_axes, None), PartitionSpec()),
    )(x, routing, weights)
    return y[:n], kept


def _exchange(
    x: jax.Array, routing: Routing, weights: ExpertWeights, ep: int, capacity_factor: float
) -> tuple[jax.Array, jax.Array]:
    """One device's part: send rows to their experts' devices, run local experts, bring back.

    x [n, D], routing [n, K] (global expert ids), weights of the E / ep local experts.
    Returns (y [n, D] partial over `tensor` if F is split, kept assignments of these tokens).
    """
    n, d = x.shape
    k = routing.expert_index.shape[1]
    e_local = weights.num_experts
    c = destination_capacity(n, k, ep, e_local, capacity_factor)
    # Sort the n*K assignments by global expert id (so by destination device); invalid tokens
    # go to a virtual expert past every device.
    flat = jnp.where(routing.valid[:, None], routing.expert_index, ep * e_local).reshape(-1)
    order = jnp.argsort(flat, stable=True)
    sorted_expert = flat[order]
    dest = sorted_expert // e_local  # ep for invalid
    counts = jnp.zeros((ep + 1,), jnp.int32).at[dest].add(1)
    starts = jnp.cumsum(counts) - counts
    rank = jnp.arange(n * k, dtype=jnp.int32) - starts[dest]
    keep = (dest < ep) & (rank < c)
    slot = jnp.where(keep, dest * c + rank, ep * c)  # ep * c: nowhere (dropped)
    # Gather, not scatter, the rows: which token (and which local expert) fills each slot.
    slot_token = jnp.full((ep * c,), n, jnp.int32).at[slot].set(order // k, mode="drop")
    slot_expert = (
        jnp.full((ep * c,), -1, jnp.int32).at[slot].set(sorted_expert % e_local, mode="drop")
    )
    send = jnp.take(x, slot_token, axis=0, mode="fill", fill_value=0)
    # Chunk j of the send buffer goes to device j; chunk i of the result came from device i.
    received = jax.lax.all_to_all(send, EXPERT_AXIS, 0, 0, tiled=True)
    received_expert = jax.lax.all_to_all(slot_expert, EXPERT_AXIS, 0, 0, tiled=True)
    local_routing = Routing(
        expert_index=jnp.maximum(received_expert, 0)[:, None],
        expert_weight=jnp.ones((ep * c, 1), x.dtype),
        valid=received_expert >= 0,
    )
    out, _ = get_dispatch(local_dispatch_name())(received, local_routing, weights, 0.0)
    returned = jax.lax.all_to_all(out, EXPERT_AXIS, 0, 0, tiled=True)
    # Back to assignment order (dropped assignments read the zero fill), then sum over top-k.
    slot_of_assignment = jnp.zeros_like(slot).at[order].set(slot)
    y_assign = jnp.take(returned, slot_of_assignment, axis=0, mode="fill", fill_value=0)
    y = jnp.einsum(
        "nkd,nk->nd", y_assign.reshape(n, k, d), routing.expert_weight.astype(y_assign.dtype)
    )
    return y, jnp.sum(keep, dtype=jnp.int32)


register_dispatch("expert_parallel", expert_parallel)
