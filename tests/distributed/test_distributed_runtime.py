"""jax.distributed start-up settings: environment and flags, when to initialise (explicit,
TPU auto-detection, single process), and the process facts of a single-process run."""

import jax
import pytest

from sao_jax.distributed import (
    DistributedConfig,
    initialization_mode,
    initialize,
    is_coordinator,
    on_cloud_tpu_vm,
    split_flags,
)

EXPLICIT = {
    "SAO_COORDINATOR_ADDRESS": "10.0.0.2:1234",
    "SAO_NUM_PROCESSES": "4",
    "SAO_PROCESS_ID": "3",
}


def test_settings_from_our_variables_then_jax_ones():
    config = DistributedConfig.from_env({**EXPLICIT, "SAO_LOCAL_DEVICE_IDS": "0,1"})
    assert (config.coordinator_address, config.num_processes, config.process_id) == (
        "10.0.0.2:1234",
        4,
        3,
    )
    assert config.local_device_ids == (0, 1)
    jax_only = {"JAX_COORDINATOR_ADDRESS": "h:1", "JAX_NUM_PROCESSES": "2", "JAX_PROCESS_ID": "0"}
    assert DistributedConfig.from_env(jax_only).coordinator_address == "h:1"
    both = {**jax_only, **EXPLICIT}
    assert DistributedConfig.from_env(both).num_processes == 4  # SAO_* wins
    assert DistributedConfig.from_env({}) == DistributedConfig()


@pytest.mark.parametrize(
    ("environ", "message"),
    [
        ({**EXPLICIT, "SAO_NUM_PROCESSES": "four"}, "SAO_NUM_PROCESSES='four' is not valid"),
        ({**EXPLICIT, "SAO_PROCESS_ID": "4"}, r"process_id 4 is outside \[0, 4\)"),
        ({"SAO_NUM_PROCESSES": "2"}, r"num_processes=2 also needs \['coordinator_address'"),
        ({**EXPLICIT, "SAO_COORDINATOR_ADDRESS": "10.0.0.2"}, "must be host:port"),
        ({"SAO_PROCESS_ID": "0"}, "process_id is set but num_processes is not"),
    ],
)
def test_bad_settings_name_the_problem(environ, message):
    with pytest.raises(ValueError, match=message):
        DistributedConfig.from_env(environ)


def test_flags_override_the_environment(monkeypatch):
    for name, value in EXPLICIT.items():
        monkeypatch.setenv(name, value)
    config, rest = split_flags(["--process_id", "1", "--config", "small", "rl.rows=8"])
    assert (config.num_processes, config.process_id) == (4, 1)
    assert rest == ["--config", "small", "rl.rows=8"]
    config, rest = split_flags(["--process-id=2", "num_processes=8", "--out", "x"])
    assert (config.num_processes, config.process_id, rest) == (8, 2, ["--out", "x"])
    for name in EXPLICIT:
        monkeypatch.delenv(name)
    with pytest.raises(ValueError, match="also needs"):  # process_id is still missing
        split_flags(["--num_processes", "2", "--coordinator_address", "a:1"])


def test_when_to_initialise(tmp_path):
    no_tpu = {"pci_root": str(tmp_path / "none")}
    assert initialization_mode(DistributedConfig.from_env(EXPLICIT), {}, **no_tpu) == "explicit"
    assert initialization_mode(DistributedConfig(num_processes=1), {}, **no_tpu) is None
    assert initialization_mode(DistributedConfig(), {}, **no_tpu) is None
    # A TPU VM without explicit settings: JAX's cluster detection takes over.
    assert initialization_mode(DistributedConfig(), {"TPU_WORKER_ID": "0"}, **no_tpu) == (
        "tpu_auto"
    )
    off = DistributedConfig(tpu_auto_detect=False)
    assert initialization_mode(off, {"TPU_WORKER_ID": "0"}, **no_tpu) is None
    with pytest.raises(ValueError, match="coordinator_address is set but num_processes is not"):
        initialization_mode(DistributedConfig(coordinator_address="h:1"), {}, **no_tpu)


def test_tpu_vm_detected_from_a_google_pci_device(tmp_path):
    device = tmp_path / "0000:00:04.0"
    device.mkdir()
    (device / "vendor").write_text("0x8086\n")
    assert not on_cloud_tpu_vm({}, pci_root=str(tmp_path))
    (device / "vendor").write_text("0x1ae0\n")
    assert on_cloud_tpu_vm({}, pci_root=str(tmp_path))


def test_a_single_process_initialises_nothing():
    info = initialize(DistributedConfig(tpu_auto_detect=False))
    assert (info.process_index, info.process_count, info.mode) == (0, 1, None)
    assert info.device_count == jax.device_count() == 8  # tests/conftest.py
    assert info.is_coordinator and is_coordinator()
    assert initialize(DistributedConfig(tpu_auto_detect=False)) == info  # idempotent
