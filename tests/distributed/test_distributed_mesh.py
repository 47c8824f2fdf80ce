"""Meshes over every process's devices: flat, hybrid (ici x dcn) sizing and its errors.
(The 2-granule hybrid mesh itself is built in test_multiprocess_sao.py.)"""

import jax
import pytest
from jax.sharding import AxisType

from sao_jax.distributed import HybridMeshConfig, describe_mesh, granules, make_global_mesh
from sao_jax.sharding import MeshConfig


def test_hybrid_sizes_multiply_ici_by_dcn():
    hybrid = HybridMeshConfig(ici=MeshConfig(fsdp=-1, expert=8), dcn=MeshConfig(data=-1, fsdp=1))
    assert hybrid.resolve(64, 2) == {"data": 2, "fsdp": 4, "expert": 8, "tensor": 1}
    assert hybrid.resolve(32, 1) == {"data": 1, "fsdp": 4, "expert": 8, "tensor": 1}
    dcn_fsdp = HybridMeshConfig(ici=MeshConfig(fsdp=2, expert=-1), dcn=MeshConfig(data=1, fsdp=4))
    assert dcn_fsdp.resolve(32, 4) == {"data": 1, "fsdp": 8, "expert": 4, "tensor": 1}


@pytest.mark.parametrize(
    ("devices", "slices", "message"),
    [
        (30, 4, "30 devices do not form 4 equal slices"),
        (32, 2, r"dcn mesh over 2 slice\(s\): .* needs 4 devices, have 2"),
        (24, 1, "ici mesh over 24 devices per slice: 24 devices do not split"),
    ],
)
def test_hybrid_sizes_that_do_not_fit_are_named(devices, slices, message):
    hybrid = HybridMeshConfig(
        ici=MeshConfig(fsdp=-1, expert=16),
        dcn=MeshConfig(data=4, fsdp=1) if slices == 2 else MeshConfig(data=-1, fsdp=1),
    )
    with pytest.raises(ValueError, match=message):
        hybrid.resolve(devices, slices)


def test_one_process_mesh_spans_all_devices_with_auto_axes():
    assert granules(jax.devices()) == (1, True)  # CPU: processes stand in for slices
    flat = make_global_mesh(MeshConfig(data=2, fsdp=-1, expert=2))
    hybrid = make_global_mesh(HybridMeshConfig(ici=MeshConfig(data=2, fsdp=-1, expert=2)))
    for mesh in (flat, hybrid):
        assert dict(mesh.shape) == {"data": 2, "fsdp": 2, "expert": 2, "tensor": 1}
        assert all(t == AxisType.Auto for t in mesh.axis_types)
        assert set(mesh.devices.flat) == set(jax.devices())
    assert describe_mesh(flat) == "data=2 fsdp=2 expert=2 tensor=1 over 8 devices in 1 process(es)"
    with pytest.raises(ValueError, match=r"dcn mesh over 1 slice\(s\)"):
        make_global_mesh(HybridMeshConfig(dcn=MeshConfig(data=2, fsdp=1)))
