"""Cloud TPU topologies: chips, hosts, HBM and peak FLOP/s per generation, and mesh presets.

Accelerator names count what Google counts: TensorCores for v4 and v5p (two per chip, one JAX
device per chip: "v5p-64" is 32 chips on 8 hosts), chips for v5e and v6e ("v6e-16" is 16
chips on 4 hosts). Single-host slices of v5e / v6e hold up to 8 chips; every multi-host slice
has 4 chips per host.
"""

from __future__ import annotations

import dataclasses
import math
import re

from sao_jax.distributed.mesh import HybridMeshConfig
from sao_jax.sharding import MeshConfig

GIB = 1024**3


@dataclasses.dataclass(frozen=True)
class TpuGeneration:
    """One TPU generation.

    Attributes:
      name: "v4", "v5e", "v5p", "v6e".
      accelerator_prefix: prefix of the gcloud accelerator type ("v5litepod" for v5e).
      runtime_version: TPU VM software version for `gcloud compute tpus tpu-vm create`.
      hbm_gib: HBM per chip (GiB).
      peak_bf16_tflops: dense bf16 peak per chip (TFLOP/s).
      cores_per_name_unit: what the number in the name counts (2: TensorCores of a megacore
        chip; 1: chips).
      single_host_chips: the most chips one host carries (larger slices: 4 per host).
      ici_preset: default axis sizes within a slice (-1: the rest).
    """

    name: str
    accelerator_prefix: str
    runtime_version: str
    hbm_gib: float
    peak_bf16_tflops: float
    cores_per_name_unit: int
    single_host_chips: int
    ici_preset: MeshConfig


GENERATIONS: dict[str, TpuGeneration] = {
    "v4": TpuGeneration(
        "v4", "v4", "tpu-ubuntu2204-base", 32, 275, 2, 4, MeshConfig(fsdp=-1, expert=4)
    ),
    "v5e": TpuGeneration(
        "v5e", "v5litepod", "v2-alpha-tpuv5-lite", 16, 197, 1, 8, MeshConfig(fsdp=-1, expert=4)
    ),
    "v5p": TpuGeneration(
        "v5p", "v5p", "v2-alpha-tpuv5", 95, 459, 2, 4, MeshConfig(fsdp=-1, expert=8)
    ),
    "v6e": TpuGeneration(
        "v6e", "v6e", "v2-alpha-tpuv6e", 32, 918, 1, 8, MeshConfig(fsdp=-1, expert=4)
    ),
}
_ALIASES = {"v5litepod": "v5e"}
CHIPS_PER_HOST = 4  # in every multi-host slice


@dataclasses.dataclass(frozen=True)
class Topology:
    """`num_slices` identical slices of `chips_per_slice` chips of one generation."""

    generation: TpuGeneration
    chips_per_slice: int
    num_slices: int = 1

    @property
    def name(self) -> str:
        """The accelerator type of one slice, as gcloud spells it ("v5p-64")."""
        units = self.chips_per_slice * self.generation.cores_per_name_unit
        return f"{self.generation.accelerator_prefix}-{units}"

    @property
    def hosts_per_slice(self) -> int:
        if self.chips_per_slice <= self.generation.single_host_chips:
            return 1
        return self.chips_per_slice // CHIPS_PER_HOST

    @property
    def chips(self) -> int:
        """Chips (= JAX devices) in all slices together."""
        return self.chips_per_slice * self.num_slices

    @property
    def hosts(self) -> int:
        """Hosts (= JAX processes) in all slices together."""
        return self.hosts_per_slice * self.num_slices

    @property
    def hbm_bytes(self) -> int:
        return int(self.generation.hbm_gib * GIB)

    @property
    def peak_flops(self) -> float:
        """Dense bf16 FLOP/s of every chip together."""
        return self.generation.peak_bf16_tflops * 1e12 * self.chips


def parse_topology(name: str, num_slices: int = 1) -> Topology:
    """ "v5p-64" / "v5litepod-16" / "v5e-16" / "v6e-8" / "v4-32" -> Topology; a clear error
    for an unknown generation or a size that is not a whole number of hosts."""
    match = re.fullmatch(r"(v\d+[a-z]*)-(\d+)", name.strip())
    if match is None:
        raise ValueError(f"topology {name!r} is not of the form <generation>-<size>, e.g. v5p-64")
    key = _ALIASES.get(match.group(1), match.group(1))
    if key not in GENERATIONS:
        raise ValueError(
            f"unknown TPU generation {match.group(1)!r} in {name!r}; known: "
            f"{', '.join(GENERATIONS)} (v5e is also spelled v5litepod)"
        )
    generation = GENERATIONS[key]
    units = int(match.group(2))
    if units % generation.cores_per_name_unit:
        raise ValueError(
            f"{name}: {key} sizes count TensorCores ({generation.cores_per_name_unit} per chip); "
            f"{units} is not a whole number of chips"
        )
    chips = units // generation.cores_per_name_unit
    if chips < 1 or (chips > generation.single_host_chips and chips % CHIPS_PER_HOST):
        raise ValueError(f"{name}: {chips} chips is not a whole number of 4-chip hosts")
    if num_slices < 1:
        raise ValueError(f"num_slices must be >= 1, got {num_slices}")
    return Topology(generation, chips, num_slices)


def mesh_preset(topology: Topology, num_experts: int = 0) -> HybridMeshConfig:
    """The default mesh of a topology: FSDP over the rest of each slice, the generation's
    expert-axis size (shrunk to divide the slice and the experts), data parallel across slices.
    """
    ici = topology.generation.ici_preset
    expert = math.gcd(ici.expert, num_experts, topology.chips_per_slice) if num_experts else 1
    return HybridMeshConfig(
        ici=dataclasses.replace(ici, expert=expert),
        dcn=MeshConfig(data=-1, fsdp=1, expert=1, tensor=1),
    )
