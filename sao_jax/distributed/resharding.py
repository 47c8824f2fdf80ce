"""Disaggregated rollout and training: separate meshes, and weights resharded between them.

Training wants FSDP x expert sharding (optimizer state dominates memory); decoding wants the
weights close to the KV cache, split over tensor / data. With `disaggregated_meshes` the
learner and the samplers run on disjoint device sets; `reshard` moves a parameter tree from
the training layout to the rollout layout on publication (`WeightPublisher(shardings=...)`).

Transfers:
- one process, or both layouts over the same devices: `jax.device_put` to the target
  NamedShardings (device-to-device; XLA moves only the shards that change owner);
- several processes, each resharding onto a mesh of its own devices (the multi-host
  experiment: every host samples on its own chips): "per_host", device to device. The
  targets are read as one global layout, a `host` axis over the processes times the local
  mesh (hosts are alike), `jax.device_put` moves each leaf there (a collective), and each
  process keeps its own shards as arrays on its local mesh;
- several processes and other device sets (multi-controller JAX refuses a direct cross-host
  `device_put` there): leaf by leaf through host memory: every process gathers the leaf and
  places its own target shards. This needs the source to span every process (each host
  trains on some of its chips and samples on the others); peak host memory is one leaf.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np
from flax import nnx
from jax.sharding import AxisType, Mesh, NamedSharding, Sharding

from sao_jax.distributed.mesh import HybridMeshConfig, make_global_mesh
from sao_jax.sharding import LogicalRules, MeshConfig, state_shardings


@dataclasses.dataclass(frozen=True)
class DisaggregatedMeshes:
    """The learner's mesh and the samplers' mesh, over disjoint devices."""

    train: Mesh
    rollout: Mesh


def split_devices(
    devices: Sequence[jax.Device], train_per_process: int
) -> tuple[list[jax.Device], list[jax.Device]]:
    """(train, rollout) devices: the first `train_per_process` devices of each process train,
    the rest of each process samples."""
    by_process: dict[int, list[jax.Device]] = {}
    for device in devices:
        by_process.setdefault(device.process_index, []).append(device)
    train, rollout = [], []
    for process, local in sorted(by_process.items()):
        if not 0 < train_per_process < len(local):
            raise ValueError(
                f"process {process} has {len(local)} devices; train_per_process must leave "
                f"both meshes at least one, got {train_per_process}"
            )
        train += local[:train_per_process]
        rollout += local[train_per_process:]
    return train, rollout


def disaggregated_meshes(
    train: MeshConfig | HybridMeshConfig,
    rollout: MeshConfig | HybridMeshConfig,
    *,
    train_per_process: int,
    devices: Sequence[jax.Device] | None = None,
) -> DisaggregatedMeshes:
    """Meshes for training and rollout on disjoint devices (see `split_devices`)."""
    train_devices, rollout_devices = split_devices(
        list(jax.devices() if devices is None else devices), train_per_process
    )
    return DisaggregatedMeshes(
        train=make_global_mesh(train, train_devices),
        rollout=make_global_mesh(rollout, rollout_devices),
    )


def rollout_shardings(
    params: nnx.State | nnx.Module, mesh: Mesh, rules: LogicalRules | None = None
) -> nnx.State:
    """NamedShardings of `params` (a model or its state) on the rollout `mesh`, from their
    logical axes: what `WeightPublisher(shardings=...)` and `Sampler(mesh=...)` expect."""
    state = nnx.state(params) if isinstance(params, nnx.Module) else params
    return state_shardings(state, mesh, rules)


def transfer_method(source: Sharding, target: Sharding) -> str:
    """ "device_put", "per_host" or "host" (see the module docstring) for one array."""
    if jax.process_count() == 1 or source.device_set == target.device_set:
        return "device_put"
    spans_job = len({d.process_index for d in source.device_set}) == jax.process_count()
    if isinstance(target, NamedSharding) and target.is_fully_addressable and spans_job:
        return "per_host"
    return "host"


def reshard(tree: Any, shardings: Any) -> Any:
    """A copy of `tree` (arrays, nnx.State, or an nnx Module's state) on `shardings` (a matching
    tree of Shardings, or one Sharding for every leaf). The source stays valid (never aliased),
    so the caller may donate it once this returns.
    """
    if isinstance(tree, nnx.Module):
        tree = nnx.state(tree)
    leaves, treedef = jax.tree.flatten(tree)
    if isinstance(shardings, Sharding):
        targets = [shardings] * len(leaves)
    else:
        targets, target_def = jax.tree.flatten(shardings)
        if target_def != treedef:
            _raise_mismatch(tree, shardings)
    methods = [transfer_method(x.sharding, s) for x, s in zip(leaves, targets, strict=True)]
    if set(methods) == {"device_put"}:
        return jax.block_until_ready(jax.device_put(tree, shardings, may_alias=False))
    out: list[Any] = [None] * len(leaves)
    per_host = [i for i, method in enumerate(methods) if method == "per_host"]
    if per_host:
        moved = _reshard_per_host([leaves[i] for i in per_host], [targets[i] for i in per_host])
        for i, array in zip(per_host, moved, strict=True):
            out[i] = array
    for i, method in enumerate(methods):
        if method != "per_host":
            out[i] = _reshard_leaf(leaves[i], targets[i])
    return jax.tree.unflatten(treedef, out)


def per_host_mesh(local: Mesh) -> Mesh:
    """The mesh ("host", *local axes) over every process's devices, each process's block laid
    out as `local` is over this process's devices (by position among its devices sorted by
    id). Every process must call it with a mesh of the same layout (checked: a collective)."""
    from sao_jax.distributed.host_sync import allgather_numbers

    mine = sorted(jax.local_devices(), key=lambda d: d.id)
    position = {d.id: i for i, d in enumerate(mine)}
    missing = [d for d in local.devices.flat if d.id not in position]
    if missing:
        raise ValueError(f"per_host_mesh: {missing[:3]} are not this process's devices")
    index = np.vectorize(lambda d: position[d.id])(local.devices)
    layouts = allgather_numbers(index.ravel())
    if not np.all(layouts == layouts[0]):
        raise ValueError(
            "per_host_mesh: the processes' local meshes differ in layout; every host must "
            "build its rollout mesh the same way"
        )
    by_process: dict[int, list[jax.Device]] = {}
    for device in sorted(jax.devices(), key=lambda d: d.id):
        by_process.setdefault(device.process_index, []).append(device)
    blocks = [np.asarray(by_process[p], dtype=object)[index] for p in sorted(by_process)]
    return Mesh(
        np.stack(blocks),
        ("host", *local.axis_names),
        axis_types=(AxisType.Auto,) * (1 + len(local.axis_names)),
    )


_PER_HOST_MESHES: dict[Mesh, Mesh] = {}


def _reshard_per_host(leaves: list[jax.Array], targets: list[NamedSharding]) -> list[jax.Array]:
    meshes = {t.mesh for t in targets}
    if len(meshes) != 1:
        raise ValueError("reshard: per-host targets must share one local mesh")
    (local,) = meshes
    if local not in _PER_HOST_MESHES:
        _PER_HOST_MESHES[local] = per_host_mesh(local)
    out = []
    for leaf, target in zip(leaves, targets, strict=True):
        # one leaf in flight at a time: XLA:CPU's fake devices can deadlock when several
        # cross-process reshards (each its own collective program) run interleaved
        job_wide = NamedSharding(_PER_HOST_MESHES[local], target.spec)
        array = jax.block_until_ready(jax.device_put(leaf, job_wide, may_alias=False))
        shards = {shard.device: shard.data for shard in array.addressable_shards}
        order = target.addressable_devices_indices_map(array.shape)
        out.append(
            jax.make_array_from_single_device_arrays(
                array.shape, target, [shards[device] for device in order]
            )
        )
    return out


def _reshard_leaf(x: jax.Array, target: Sharding) -> jax.Array:
    if transfer_method(x.sharding, target) == "device_put":
        return jax.block_until_ready(jax.device_put(x, target, may_alias=False))
    from jax.experimental import multihost_utils

    holders = {d.process_index for d in x.sharding.device_set}
    if len(holders) != jax.process_count():
        raise ValueError(
            f"cannot reshard across hosts: the source lives on processes {sorted(holders)} of "
            f"{jax.process_count()}; every process must hold part of the training mesh (or "
            "use one device set for both layouts)"
        )
    host = multihost_utils.process_allgather(x, tiled=True)
    return jax.make_array_from_callback(x.shape, target, lambda index: host[index])


def _raise_mismatch(tree: Any, shardings: Any) -> None:
    have = {jax.tree_util.keystr(p) for p, _ in jax.tree.leaves_with_path(tree)}
    want = {
        jax.tree_util.keystr(p)
        for p, _ in jax.tree.leaves_with_path(shardings, is_leaf=lambda s: isinstance(s, Sharding))
    }
    missing, extra = sorted(want - have), sorted(have - want)
    raise ValueError(
        "reshard: the shardings do not match the tree"
        + (f"; no array for {missing[:5]}" if missing else "")
        + (f"; no sharding for {extra[:5]}" if extra else "")
    )


def layout(tree: Any) -> dict[str, str]:
    """`{path: "PartitionSpec(...) on devices [..]"}` of a tree of arrays (logs and tests)."""
    out = {}
    for path, x in jax.tree.leaves_with_path(tree):
        sharding = x.sharding
        spec = sharding.spec if isinstance(sharding, NamedSharding) else sharding
        out[jax.tree_util.keystr(path)] = (
            f"{spec} on devices {sorted(d.id for d in sharding.device_set)}"
        )
    return out
