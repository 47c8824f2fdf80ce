"""Two real JAX processes over loopback (2 fake CPU devices each) run one SAO learner iteration
and end with the same parameters as one process on 4 devices with the same mesh shape; the
per-process loader shards, the process-0-only metrics, the collective orbax checkpoint and the
cross-process weight resharding are checked on the way."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from flax import nnx
from multiprocess_sao_setup import MODEL, write_episodes

from sao_jax.distributed.local_launch import launch_local
from sao_jax.metrics import read_metrics
from sao_jax.models import init_model
from sao_jax.xla_flags import with_cpu_device_count

WORKER = Path(__file__).parent / "multiprocess_sao_worker.py"
REPO = Path(__file__).parents[2]
TIMEOUT_S = 240
# Unoptimised LLVM code: these processes run one step each, and compiling dominates (~2x).
# Fake devices are threads: on a loaded CI machine one may reach a collective long after its
# peers, and XLA:CPU aborts the process after 40 s by default.
XLA_FLAGS = (
    "--xla_backend_optimization_level=0 --xla_cpu_collective_call_terminate_timeout_seconds=600"
)


def launch(store: Path, out: Path) -> None:
    """Processes 0 and 1 of the job (`local_launch`), and the single-process reference on 4
    devices beside them."""
    base = dict(
        os.environ,
        JAX_PLATFORMS="cpu",
        PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
        XLA_FLAGS=XLA_FLAGS,
    )
    argv = [sys.executable, str(WORKER), str(store), str(out)]
    job_variables = ("SAO_COORDINATOR_ADDRESS", "SAO_NUM_PROCESSES", "SAO_PROCESS_ID")
    reference_env = {k: v for k, v in base.items() if k not in job_variables}
    reference_env["XLA_FLAGS"] = with_cpu_device_count(XLA_FLAGS, 4)
    with (out / "reference.log").open("w") as log:
        reference = subprocess.Popen(
            [*argv, "--reference"], env=reference_env, stdout=log, stderr=subprocess.STDOUT
        )
    try:
        job = launch_local(argv, 2, devices_per_process=2, logs=out, timeout_s=TIMEOUT_S, env=base)
        code = reference.wait(timeout=TIMEOUT_S) if job.ok else None
    finally:
        if reference.poll() is None:
            reference.kill()
            reference.wait()
    assert job.ok, job.describe()
    assert code == 0, (out / "reference.log").read_text()[-3000:]


@pytest.mark.slow
def test_two_processes_train_like_one(tmp_path):
    store = tmp_path / "atdp"
    write_episodes(store)
    launch(store, tmp_path)

    checks = json.loads((tmp_path / "worker.json").read_text())
    assert checks["mesh"] == "data=1 fsdp=2 expert=2 tensor=1 over 4 devices in 2 process(es)"
    assert checks["policy_version"] == 1
    assert checks["loader_own_shard"] and checks["loader_disjoint"]
    assert checks["restored_equal"] and checks["restored_on_mesh"]
    assert checks["reshard_same_devices"] and checks["reshard_other_devices"]
    records = read_metrics(tmp_path)  # process 0 alone wrote: one record, not two
    assert len(records) == 1
    assert records[0]["policy/skipped"] == 0.0

    trained = dict(np.load(tmp_path / "params.npz"))
    reference = dict(np.load(tmp_path / "reference.npz"))
    assert sorted(trained) == sorted(reference)
    for name, want in reference.items():
        np.testing.assert_allclose(trained[name], want, rtol=1e-5, atol=1e-6, err_msg=name)
    initial = {
        "policy:" + "/".join(map(str, path)): np.asarray(variable.get_value())
        for path, variable in nnx.to_flat_state(nnx.state(init_model(MODEL), nnx.Param))
    }
    moved = [name for name, before in initial.items() if not np.allclose(trained[name], before)]
    assert len(moved) >= 0.7 * len(initial), moved  # the policy step changed most tensors
