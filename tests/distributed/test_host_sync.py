"""Host values exchanged between two real processes over loopback (`host_sync`), and the same
calls in one process."""

import json
import sys
from pathlib import Path

import numpy as np

from sao_jax.distributed.host_sync import (
    allgather_json,
    allgather_numbers,
    any_process,
)
from sao_jax.distributed.local_launch import launch_local

WORKER = Path(__file__).parent / "host_sync_worker.py"
REPO = Path(__file__).parents[2]


def test_two_processes_see_each_others_values(tmp_path):
    result = launch_local(
        [sys.executable, str(WORKER), str(tmp_path)],
        2,
        devices_per_process=1,
        logs=tmp_path / "logs",
        timeout_s=120,
        cwd=REPO,
    )
    assert result.ok, result.describe()
    records = [json.loads((tmp_path / f"process{i}.json").read_text()) for i in range(2)]
    for record in records:  # every process received the same, in process order
        assert record["numbers"] == [[0.5, 3 * 2**26], [1.5, 3 * 2**26 + 1]]
        assert record["any_only_last"] is True and record["any_none"] is False
        assert record["json"] == [
            {"process": 0, "text": "é", "list": []},
            {"process": 1, "text": "éé", "list": [0]},
        ]


def test_one_process_gets_its_own_values_back():
    np.testing.assert_array_equal(allgather_numbers([1.5, 2**30]), [[1.5, 2**30]])
    assert any_process(True) and not any_process(False)
    assert allgather_json({"x": [1, "y"]}) == [{"x": [1, "y"]}]
