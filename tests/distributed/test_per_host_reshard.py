"""Weights trained across two processes reach each process's own rollout mesh device to device
(`reshard`'s per-host path), equal to the host-memory path and to the source."""

import json
import sys
from pathlib import Path

from sao_jax.distributed.local_launch import launch_local

WORKER = Path(__file__).parent / "per_host_reshard_worker.py"
REPO = Path(__file__).parents[2]


def test_each_process_receives_the_whole_policy_on_its_own_mesh(tmp_path):
    result = launch_local(
        [sys.executable, str(WORKER), str(tmp_path)],
        2,
        devices_per_process=2,
        logs=tmp_path / "logs",
        timeout_s=180,
        cwd=REPO,
    )
    assert result.ok, result.describe()
    for index in range(2):
        record = json.loads((tmp_path / f"process{index}.json").read_text())
        assert record["methods"] == ["per_host"]
        assert record["spread_over_processes"] > 0  # the source really spans both processes
        assert record["on_local_mesh"] and record["source_still_valid"]
        assert record["equal_to_source"] and record["equal_to_host_path"]
        assert record["sharded_locally"] > 0  # tensor-split leaves, not only replicas
