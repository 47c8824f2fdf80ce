"""One call that starts an experiment's process in a job: `jax.distributed`, then its mesh.

An experiment nests a `MeshSpec` in its config (the launcher passes `mesh.ici.<axis>=n` and
`mesh.dcn.<axis>=n`) and calls `setup_job` before it touches a device:

    job = setup_job(config.mesh)  # initialises jax.distributed when there are several processes
    learner = Learner(config.learner, policy, mesh=job.mesh)
    if job.is_primary:
        save_summary(out_dir, summary)

With one process and no mesh settings nothing is sharded (`job.mesh is None`), exactly as
before; several processes always get a mesh, because every array must then span the job.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import jax
from jax.sharding import Mesh

from sao_jax.distributed.mesh import HybridMeshConfig, make_global_mesh
from sao_jax.distributed.runtime import DistributedConfig, ProcessInfo, initialize
from sao_jax.sharding import MeshConfig


@dataclasses.dataclass(frozen=True)
class DcnMeshConfig(MeshConfig):
    """Axis sizes across slices (off TPU: across processes); by default `data` spans them."""

    data: int = -1
    fsdp: int = 1


@dataclasses.dataclass
class MeshSpec:
    """The device mesh of a run, as an experiment config field.

    Attributes:
      ici: axis sizes within a slice (data, fsdp, expert, tensor; -1 = the rest). None: no
        mesh on a single process, `fsdp` over every device of several.
      dcn: axis sizes across slices (off TPU: across processes); None: `data` over all of them.
      rollout: axis sizes of each process's sampling mesh over its own devices, used when the
        job has several processes (each runs its own rollout engine and receives the
        published weights resharded there); None: `fsdp` over them. One process samples on
        the training mesh.
    """

    ici: MeshConfig | None = None
    dcn: DcnMeshConfig | None = None
    rollout: MeshConfig | None = None

    @property
    def requested(self) -> bool:
        """Whether any axis size was given (then a mesh is built even on one process)."""
        return self.ici is not None or self.dcn is not None

    def hybrid(self) -> HybridMeshConfig:
        """The ici x dcn sizes, each part's defaults filled in."""
        return HybridMeshConfig(ici=self.ici or MeshConfig(), dcn=self.dcn or DcnMeshConfig())


@dataclasses.dataclass(frozen=True)
class Job:
    """This process's place in the run: its facts and the mesh every part shares."""

    info: ProcessInfo
    mesh: Mesh | None

    @property
    def is_primary(self) -> bool:
        """Process 0: the only one that writes metrics, summaries and plots, and prints."""
        return self.info.process_index == 0


def setup_job(
    spec: MeshSpec,
    distributed: DistributedConfig | None = None,
    *,
    devices: Sequence[jax.Device] | None = None,
) -> Job:
    """Join the job (`initialize(distributed)`, default from the environment; a no-op on one
    process), then build the global (data, fsdp, expert, tensor) mesh over `devices` (default:
    every process's) when `spec` asks for one or there are several processes.

    A mesh that does not fit the devices fails here with the sizes named (`ici mesh over 8
    devices per slice: ...`), before any model is built.
    """
    info = initialize(distributed)
    if not spec.requested and info.process_count == 1:
        return Job(info=info, mesh=None)
    return Job(info=info, mesh=make_global_mesh(spec.hybrid(), devices))
