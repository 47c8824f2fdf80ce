"""Two real JAX processes over loopback (2 fake CPU devices each) run one SAO learner iteration
and end with the same parameters as one process on 4 devices with the same mesh shape; the
per-process loader shards, the process-0-only metrics, the collective orbax checkpoint and the
cross-process weight resharding are checked on the way."""

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from flax import nnx
from multiprocess_sao_setup import MODEL, write_episodes

from sao_jax.metrics import read_metrics
from sao_jax.models import init_model

WORKER = Path(__file__).parent / "multiprocess_sao_worker.py"
REPO = Path(__file__).parents[2]
TIMEOUT_S = 240
# Unoptimised LLVM code: these processes run one step each, and compiling dominates (~2x).
# Fake devices are threads: on a loaded CI machine one may reach a collective long after its
# peers, and XLA:CPU aborts the process after 40 s by default.
XLA_FLAGS = (
    "--xla_backend_optimization_level=0 --xla_cpu_collective_call_terminate_timeout_seconds=600 "
    "--xla_force_host_platform_device_count="
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_together(jobs: dict[str, tuple[list[str], dict]], logs: Path) -> None:
    """Start every job, wait for all; if one fails or time runs out, kill the rest (a peer
    that died leaves the others waiting in a collective) and fail with their logs."""
    running = {}
    for name, (argv, env) in jobs.items():
        with (logs / f"{name}.log").open("w") as log:
            running[name] = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + TIMEOUT_S
    try:
        while any(p.poll() is None for p in running.values()):
            if any(p.poll() not in (None, 0) for p in running.values()):
                break
            if time.monotonic() > deadline:
                break
            time.sleep(0.2)
    finally:
        for process in running.values():
            if process.poll() is None:
                process.kill()
                process.wait()
    codes = {name: p.returncode for name, p in running.items()}
    assert set(codes.values()) == {0}, "\n".join(
        f"--- {name} exited {code}:\n{(logs / f'{name}.log').read_text()[-3000:]}"
        for name, code in codes.items()
    )


def launch(store: Path, out: Path) -> None:
    """Processes 0 and 1 of the job, and the single-process reference, all at once."""
    base = dict(
        os.environ,
        JAX_PLATFORMS="cpu",
        PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
    )
    for name in ("SAO_COORDINATOR_ADDRESS", "SAO_NUM_PROCESSES", "SAO_PROCESS_ID"):
        base.pop(name, None)
    argv = [sys.executable, str(WORKER), str(store), str(out)]
    job = dict(
        base,
        XLA_FLAGS=XLA_FLAGS + "2",
        SAO_COORDINATOR_ADDRESS=f"127.0.0.1:{free_port()}",
        SAO_NUM_PROCESSES="2",
    )
    run_together(
        {
            "process0": (argv, dict(job, SAO_PROCESS_ID="0")),
            "process1": (argv, dict(job, SAO_PROCESS_ID="1")),
            "reference": ([*argv, "--reference"], dict(base, XLA_FLAGS=XLA_FLAGS + "4")),
        },
        out,
    )


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
