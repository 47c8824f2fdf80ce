"""Scale-out: multi-process start-up, meshes across processes and slices, disaggregated
rollout / training meshes with weight resharding, TPU topologies. (The memory dry-run plans a
learner, so it lives above this package: `sao_jax.train.memory`.)"""

from sao_jax.distributed.job import DcnMeshConfig, Job, MeshSpec, setup_job
from sao_jax.distributed.mesh import (
    HybridMeshConfig,
    describe_mesh,
    granules,
    make_global_mesh,
)
from sao_jax.distributed.resharding import (
    DisaggregatedMeshes,
    disaggregated_meshes,
    layout,
    per_host_mesh,
    reshard,
    rollout_shardings,
    split_devices,
    transfer_method,
)
from sao_jax.distributed.runtime import (
    DistributedConfig,
    ProcessInfo,
    barrier,
    initialization_mode,
    initialize,
    is_coordinator,
    on_cloud_tpu_vm,
    process_info,
    shutdown,
    split_flags,
)

__all__ = [
    "DcnMeshConfig",
    "DisaggregatedMeshes",
    "DistributedConfig",
    "HybridMeshConfig",
    "Job",
    "MeshSpec",
    "ProcessInfo",
    "barrier",
    "describe_mesh",
    "disaggregated_meshes",
    "granules",
    "initialization_mode",
    "initialize",
    "is_coordinator",
    "layout",
    "make_global_mesh",
    "on_cloud_tpu_vm",
    "per_host_mesh",
    "process_info",
    "reshard",
    "rollout_shardings",
    "setup_job",
    "shutdown",
    "split_devices",
    "split_flags",
    "transfer_method",
]
