"""Dispatch cost of expert parallelism vs the single-device dispatch, on 8 fake CPU devices.

One MoE layer's dispatch (forward + backward, the cost a training step pays per layer) of the
`small` preset's shapes, side by side in one run:
- `sorted_capacity`, no mesh: one device does all the work (the reference);
- `sorted_capacity` on the 8-device mesh: XLA partitions the single-device code by itself;
- `expert_parallel` on the same mesh: shard_map + two all-to-alls, each device runs its own
  experts on the rows sent to it.
Each runs dropless and with a capacity factor. Dropless expert parallelism with static shapes
sizes every destination buffer for the worst case (all of a device's tokens routed to one
device), so each device runs ep * n_local * min(K, E / ep) rows through its experts where
n_local * K arrive on average; a capacity factor sizes it to the average share instead (the
"EP rows/device" column). On a mesh the inputs are placed as the model holds them (tokens
over the batch axes, expert weights over `expert` x `fsdp`), so no call pays a host-to-device
copy. Fake CPU devices share this machine's cores, so the ratios measure overhead (sorting,
packing, collectives, partitioning, padded rows), not the speed-up of real chips.

    python benchmarks/scaling_expert_parallel.py [tokens=4096] [repeats=3] [capacity_factors=[0,1.25]]
"""

from __future__ import annotations

import os

from sao_jax.xla_flags import cpu_device_count, with_cpu_device_count  # no JAX import

# 8 fake CPU devices unless the caller asked for a count, beside whatever XLA flags the caller
# set (before JAX starts its backend)
if cpu_device_count(os.environ.get("XLA_FLAGS", "")) is None:
    os.environ["XLA_FLAGS"] = with_cpu_device_count(os.environ.get("XLA_FLAGS", ""), 8)

import dataclasses
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

from sao_jax.config_cli import parse_cli
from sao_jax.models import get_dispatch, get_model_config
from sao_jax.models.expert_parallel import destination_capacity
from sao_jax.models.moe_dispatch import ExpertWeights, Routing
from sao_jax.sharding import MeshConfig, make_mesh, named_sharding

# Logical axes of the MoE layer's inputs, as `sao_jax.models.moe` annotates them.
TOKEN_AXES = ("batch", "act_embed")
WEIGHT_AXES = ExpertWeights(
    gate=("experts", "embed", "expert_mlp"),
    up=("experts", "embed", "expert_mlp"),
    down=("experts", "expert_mlp", "embed"),
)


@dataclasses.dataclass
class BenchConfig:
    """Attributes:
    preset: model preset whose MoE shapes are used. tokens: tokens per dispatch.
    repeats: timed calls (the best is reported). meshes: expert-axis sizes to run on 8 devices
    (the rest of the devices go to fsdp). capacity_factors: 0 = dropless; > 0 caps each
    expert's (single device) or each destination device's (expert parallel) buffer.
    """

    preset: str = "small"
    tokens: int = 4096
    repeats: int = 3
    meshes: list[int] = dataclasses.field(default_factory=lambda: [8, 4])
    capacity_factors: list[float] = dataclasses.field(default_factory=lambda: [0.0, 1.25])


def problem(config, n: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    e, d, f, k = (
        config.num_experts,
        config.d_model,
        config.moe_intermediate_size,
        config.num_experts_per_token,
    )
    logits = rng.normal(size=(n, e))
    index = np.argsort(-logits, axis=1)[:, :k].astype(np.int32)
    weight = np.take_along_axis(jax.nn.softmax(logits), index, axis=1).astype(np.float32)
    routing = Routing(jnp.asarray(index), jnp.asarray(weight), jnp.ones((n,), bool))
    weights = ExpertWeights(
        *(
            jnp.asarray(rng.normal(size=s) / s[1] ** 0.5, jnp.float32)
            for s in ((e, d, f), (e, d, f), (e, f, d))
        )
    )
    return jnp.asarray(rng.normal(size=(n, d)), jnp.float32), routing, weights


def placed(args, mesh):
    """The problem on `mesh` with the model's shardings (unchanged without a mesh)."""
    if mesh is None:
        return args
    x, routing, weights = args
    rows = named_sharding(mesh, ("batch",), routing.valid.shape)
    routing_rows = named_sharding(mesh, ("batch", None), routing.expert_index.shape)
    return (
        jax.device_put(x, named_sharding(mesh, TOKEN_AXES, x.shape)),
        Routing(
            jax.device_put(routing.expert_index, routing_rows),
            jax.device_put(routing.expert_weight, routing_rows),
            jax.device_put(routing.valid, rows),
        ),
        ExpertWeights(
            *(
                jax.device_put(w, named_sharding(mesh, getattr(WEIGHT_AXES, name), w.shape))
                for name, w in (("gate", weights.gate), ("up", weights.up), ("down", weights.down))
            )
        ),
    )


def best_time(name: str, args, mesh, capacity_factor: float, repeats: int) -> tuple[float, int]:
    """(best seconds of a jitted forward + backward, assignments kept)."""
    x, routing, weights = placed(args, mesh)

    def loss(x, weights):
        y, kept = get_dispatch(name)(x, routing, weights, capacity_factor)
        return jnp.sum(y * y), kept

    step = jax.jit(jax.grad(loss, argnums=(0, 1), has_aux=True))

    def call():
        if mesh is None:
            return jax.block_until_ready(step(x, weights))
        with jax.set_mesh(mesh):
            return jax.block_until_ready(step(x, weights))

    _, kept = call()  # compile
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        call()
        best = min(best, time.perf_counter() - start)
    return best, int(kept)


def expert_rows_per_device(config, mesh, tokens: int, capacity_factor: float) -> int:
    """Rows one device of the mesh's expert axis runs through its experts (received buffer)."""
    ep = mesh.shape["expert"]
    local = tokens // (mesh.shape["data"] * mesh.shape["fsdp"] * ep)  # the batch axes
    k, e = config.num_experts_per_token, config.num_experts
    return ep * destination_capacity(local, k, ep, e // ep, capacity_factor)


def main(argv: list[str]) -> None:
    cfg = parse_cli(argv, {"default": BenchConfig()}, save=False)
    config = get_model_config(cfg.preset)
    args = problem(config, cfg.tokens)
    assignments = cfg.tokens * config.num_experts_per_token
    rows = []
    for factor in cfg.capacity_factors:
        reference, kept = best_time("sorted_capacity", args, None, factor, cfg.repeats)
        rows.append((factor, "sorted_capacity", "none (1 device)", reference, kept, reference, ""))
        for expert in cfg.meshes:
            mesh = make_mesh(MeshConfig(data=1, fsdp=-1, expert=expert, tensor=1))
            shape = " ".join(f"{k}={v}" for k, v in mesh.shape.items() if v > 1)
            for name in ("sorted_capacity", "expert_parallel"):
                seconds, kept = best_time(name, args, mesh, factor, cfg.repeats)
                received = (
                    expert_rows_per_device(config, mesh, cfg.tokens, factor)
                    if name == "expert_parallel"
                    else ""
                )
                rows.append((factor, name, shape, seconds, kept, reference, received))
    print(
        f"{cfg.preset} MoE layer: E={config.num_experts} top-{config.num_experts_per_token} "
        f"D={config.d_model} F={config.moe_intermediate_size}, {cfg.tokens} tokens "
        f"({assignments} assignments), forward + backward; {jax.device_count()} fake CPU devices "
        f"on {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}; best of {cfg.repeats}"
    )
    print(
        f"{'capacity':>8} {'dispatch':16} {'mesh':18} {'time (ms)':>10} {'vs 1 device':>12} "
        f"{'dropped':>8} {'EP rows/device':>15}"
    )
    for factor, name, shape, seconds, kept, reference, received in rows:
        label = "dropless" if factor <= 0 else f"{factor:g}"
        print(
            f"{label:>8} {name:16} {shape:18} {seconds * 1e3:10.1f} {seconds / reference:11.2f}x "
            f"{1 - kept / assignments:8.1%} {received:>15}"
        )


if __name__ == "__main__":
    main(sys.argv[1:])
