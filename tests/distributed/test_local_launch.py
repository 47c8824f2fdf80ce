"""`local_launch`: the job environment each process gets, and a failed process stopping its
peers instead of leaving them waiting."""

import sys
import time

import pytest

from sao_jax.distributed.local_launch import launch_local, main, process_environment

PRINT_JOB = (
    "import os; print(os.environ['SAO_PROCESS_ID'], os.environ['SAO_NUM_PROCESSES'], "
    "os.environ['SAO_COORDINATOR_ADDRESS'], os.environ['XLA_FLAGS'], "
    "os.environ.get('JAX_PROCESS_ID'))"
)


def test_each_process_gets_its_index_one_coordinator_and_its_devices(tmp_path):
    env = {"PATH": "/usr/bin:/bin", "XLA_FLAGS": "--xla_force_host_platform_device_count=8 --foo"}
    env["JAX_PROCESS_ID"] = "7"  # a stale variable of an outer job must not leak in
    result = launch_local(
        [sys.executable, "-c", PRINT_JOB], 3, devices_per_process=2, logs=tmp_path, env=env
    )
    assert result.ok, result.describe()
    lines = [path.read_text().split() for path in result.logs]
    assert [line[0] for line in lines] == ["0", "1", "2"]
    assert {line[1] for line in lines} == {"3"}
    assert len({line[2] for line in lines}) == 1 and lines[0][2].startswith("127.0.0.1:")
    for line in lines:
        flags = line[3:-1]
        assert "--xla_force_host_platform_device_count=2" in flags and "--foo" in flags
        assert not any(f.endswith("=8") for f in flags)
        assert line[-1] == "None"


def test_a_failed_process_stops_its_waiting_peers(tmp_path):
    script = (
        "import os, sys, time\n"
        "if os.environ['SAO_PROCESS_ID'] == '1': sys.exit(3)\n"
        "time.sleep(120)\n"
    )
    start = time.monotonic()
    result = launch_local([sys.executable, "-c", script], 2, logs=tmp_path)
    assert time.monotonic() - start < 60  # not the 120 s process 0 would sleep
    assert result.returncodes[1] == 3 and result.returncodes[0] != 0 and not result.ok
    assert "process 1 exited 3" in result.describe()


def test_a_job_past_its_deadline_is_stopped(tmp_path):
    result = launch_local(
        [sys.executable, "-c", "import time; time.sleep(120)"], 2, logs=tmp_path, timeout_s=1
    )
    assert result.timed_out and not result.ok


def test_devices_left_alone_when_not_asked():
    env = process_environment(0, 2, "127.0.0.1:1", None, {"XLA_FLAGS": "--x"})
    assert env["XLA_FLAGS"] == "--x" and "JAX_PLATFORMS" not in env


def test_bad_invocations_are_refused(capsys):
    assert main(["--num_processes", "2"]) == 2  # no command
    assert "usage" in capsys.readouterr().err
    with pytest.raises(ValueError, match="num_processes must be >= 1"):
        launch_local(["true"], 0)
    with pytest.raises(ValueError, match="give the command"):
        launch_local([], 2)
