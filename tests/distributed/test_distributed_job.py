"""setup_job: no mesh on one process without settings, the ici x dcn mesh when asked (on the 8
fake CPU devices), clear errors for a mesh that does not fit, and MeshSpec as a CLI config."""

import dataclasses

import jax
import pytest

from sao_jax.config_cli import ConfigError, apply_overrides
from sao_jax.distributed import DcnMeshConfig, MeshSpec, setup_job
from sao_jax.sharding import MeshConfig


@dataclasses.dataclass
class _Experiment:
    mesh: MeshSpec = dataclasses.field(default_factory=MeshSpec)


def test_one_process_without_settings_shards_nothing():
    job = setup_job(MeshSpec())
    assert job.mesh is None
    assert job.is_primary and job.info.process_count == 1


def test_ici_sizes_build_the_mesh_with_the_rest_filled():
    job = setup_job(MeshSpec(ici=MeshConfig(data=2, fsdp=-1, expert=2, tensor=1)))
    assert dict(job.mesh.shape) == {"data": 2, "fsdp": 2, "expert": 2, "tensor": 1}
    assert job.mesh.devices.size == jax.device_count() == 8
    assert all(t == jax.sharding.AxisType.Auto for t in job.mesh.axis_types)
    # dcn alone: one process is one slice, so `data=-1` across slices is 1
    job = setup_job(MeshSpec(dcn=DcnMeshConfig()), devices=jax.devices()[:4])
    assert dict(job.mesh.shape) == {"data": 1, "fsdp": 4, "expert": 1, "tensor": 1}


def test_a_mesh_that_does_not_fit_names_the_part_and_sizes():
    with pytest.raises(ValueError, match="ici mesh over 8 devices per slice"):
        setup_job(MeshSpec(ici=MeshConfig(data=3, fsdp=-1)))
    with pytest.raises(ValueError, match="dcn mesh over 1 slice"):
        setup_job(MeshSpec(dcn=DcnMeshConfig(data=2)))


def test_mesh_spec_from_dotted_overrides():
    parsed = apply_overrides(_Experiment(), ["mesh.ici.expert=4", "mesh.dcn.data=2"]).mesh
    assert parsed.ici == MeshConfig(data=1, fsdp=-1, expert=4, tensor=1)
    assert parsed.dcn == DcnMeshConfig(data=2, fsdp=1, expert=1, tensor=1)  # its own defaults
    assert apply_overrides(_Experiment(), []).mesh.requested is False
    assert MeshSpec().hybrid().dcn == DcnMeshConfig(data=-1, fsdp=1, expert=1, tensor=1)
    with pytest.raises(ConfigError, match=r"mesh\.ici\.experts"):
        apply_overrides(_Experiment(), ["mesh.ici.experts=4"])
    with pytest.raises(ConfigError, match=r"mesh\.ici\.expert expects"):
        apply_overrides(_Experiment(), ["mesh.ici.expert=four"])
