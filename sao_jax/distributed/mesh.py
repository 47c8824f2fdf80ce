"""Meshes over every process's devices: one slice (ICI only) or several (ICI x DCN).

A pod slice is one fast interconnect (ICI); several slices talk over the data-centre network
(DCN), ~10x slower. `HybridMeshConfig` sizes the four mesh axes twice: `ici` within a slice,
`dcn` across slices (usually `data`, whose gradients are all-reduced once per step). The mesh
axis sizes are their products, so model code and logical-axis rules are the same on a laptop,
one slice and many. `-1` fills the rest of a slice (ici) or of the slice count (dcn).

Without slices (CPU, GPU, tests) each process counts as one "slice" when a dcn size above 1 is
asked for, which is what the 2-process loopback tests use.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import jax
import numpy as np
from jax.experimental import mesh_utils
from jax.sharding import AxisType, Mesh

from sao_jax.sharding import MESH_AXES, MeshConfig, make_mesh


@dataclasses.dataclass(frozen=True)
class HybridMeshConfig:
    """Axis sizes within a slice (`ici`) and across slices (`dcn`); see the module docstring."""

    ici: MeshConfig = dataclasses.field(default_factory=MeshConfig)
    dcn: MeshConfig = dataclasses.field(
        default_factory=lambda: MeshConfig(data=-1, fsdp=1, expert=1, tensor=1)
    )

    def resolve(self, num_devices: int, num_slices: int) -> dict[str, int]:
        """Total size of each axis for `num_devices` devices in `num_slices` equal slices."""
        if num_slices < 1 or num_devices % num_slices:
            raise ValueError(f"{num_devices} devices do not form {num_slices} equal slices")
        try:
            dcn = self.dcn.resolve(num_slices)
        except ValueError as error:
            raise ValueError(f"dcn mesh over {num_slices} slice(s): {error}") from error
        try:
            ici = self.ici.resolve(num_devices // num_slices)
        except ValueError as error:
            raise ValueError(
                f"ici mesh over {num_devices // num_slices} devices per slice: {error}"
            ) from error
        return {axis: i * d for axis, i, d in zip(MESH_AXES, ici, dcn, strict=True)}


def granules(devices: Sequence[jax.Device]) -> tuple[int, bool]:
    """(number of slices, whether processes stand in for them): TPU devices carry a real slice
    index; elsewhere (CPU, GPU) each process is one granule of the slow network."""
    if all(d.platform == "tpu" for d in devices):
        return len({getattr(d, "slice_index", 0) for d in devices}), False
    return len({d.process_index for d in devices}), True


def make_global_mesh(
    config: HybridMeshConfig | MeshConfig,
    devices: Sequence[jax.Device] | None = None,
) -> Mesh:
    """The (data, fsdp, expert, tensor) mesh over `devices` (default: every process's), Auto axes.

    A `MeshConfig` gives one flat mesh (`jax.make_mesh`, topology-aware device order). A
    `HybridMeshConfig` over several slices (processes off TPU) uses
    `mesh_utils.create_hybrid_device_mesh`, so the dcn part of each axis strides across slices
    and collectives along the ici parts stay inside one.
    """
    devices = list(jax.devices() if devices is None else devices)
    if isinstance(config, MeshConfig):
        return make_mesh(config, devices)
    count, process_is_granule = granules(devices)
    config.resolve(len(devices), count)  # validates, with errors naming ici or dcn
    if count == 1:
        return make_mesh(config.ici, devices)
    grid = mesh_utils.create_hybrid_device_mesh(
        config.ici.resolve(len(devices) // count),
        config.dcn.resolve(count),
        devices,
        process_is_granule=process_is_granule,
    )
    return Mesh(np.asarray(grid), MESH_AXES, axis_types=(AxisType.Auto,) * len(MESH_AXES))


def describe_mesh(mesh: Mesh) -> str:
    """ "data=2 fsdp=4 expert=2 tensor=1 over 16 devices in 2 processes" (for start-up logs)."""
    axes = " ".join(f"{name}={size}" for name, size in mesh.shape.items())
    processes = len({d.process_index for d in mesh.devices.flat})
    return f"{axes} over {mesh.devices.size} devices in {processes} process(es)"
