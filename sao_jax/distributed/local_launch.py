"""Run a multi-process job on one machine: N copies of a command joined over loopback.

What a pod does with one process per host, a laptop does with N local processes, each with
its own fake CPU devices; the program cannot tell the difference (`jax.distributed` over
loopback, gloo collectives). Use it to try a multi-host run before paying for a pod:

    python -m sao_jax.distributed.local_launch --num_processes 2 --devices_per_process 2 \\
        --logs runs/mp_logs -- python -m experiments.alfworld_sao --config micro --out runs/mp

Every process gets `SAO_COORDINATOR_ADDRESS` (a free loopback port), `SAO_NUM_PROCESSES`,
`SAO_PROCESS_ID` and, off accelerators, `XLA_FLAGS` with its device count. Process 0's output
goes to this terminal (or LOGS/process0.log), the others' to LOGS/process<i>.log. When one
process fails or the time runs out, the others are stopped too: a peer that died leaves the
rest waiting in a collective forever.
"""

from __future__ import annotations

import dataclasses
import os
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from sao_jax.config_cli import parse_cli
from sao_jax.xla_flags import with_cpu_device_count, with_default

# Fake devices are threads: on a loaded machine one may reach a collective long after its
# peers, and XLA:CPU aborts the process after 40 s by default.
CPU_COLLECTIVE_TIMEOUT_FLAG = "--xla_cpu_collective_call_terminate_timeout_seconds=600"
_JOB_VARIABLES = (
    "SAO_COORDINATOR_ADDRESS",
    "SAO_NUM_PROCESSES",
    "SAO_PROCESS_ID",
    "JAX_COORDINATOR_ADDRESS",
    "JAX_NUM_PROCESSES",
    "JAX_PROCESS_ID",
)


@dataclasses.dataclass(frozen=True)
class LocalJobResult:
    """Exit code per process (process order; None: killed after the deadline) and logs."""

    returncodes: tuple[int | None, ...]
    logs: tuple[Path | None, ...]
    timed_out: bool

    @property
    def ok(self) -> bool:
        return all(code == 0 for code in self.returncodes)

    def describe(self, tail_chars: int = 3000) -> str:
        """Each process's exit code and the end of its log (for errors and test failures)."""
        parts = [f"timed out: {self.timed_out}"]
        for index, (code, log) in enumerate(zip(self.returncodes, self.logs, strict=True)):
            text = log.read_text(errors="replace")[-tail_chars:] if log and log.exists() else ""
            parts.append(f"--- process {index} exited {code}:\n{text}")
        return "\n".join(parts)


def free_port() -> int:
    """An unused loopback TCP port for the coordinator."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def process_environment(
    index: int,
    num_processes: int,
    coordinator: str,
    devices_per_process: int | None,
    base: Mapping[str, str],
) -> dict[str, str]:
    """The environment of process `index`: `base` plus the job variables (and on CPU the fake
    device count and a patient collective timeout in XLA_FLAGS)."""
    env = {k: v for k, v in base.items() if k not in _JOB_VARIABLES}
    env.update(
        SAO_COORDINATOR_ADDRESS=coordinator,
        SAO_NUM_PROCESSES=str(num_processes),
        SAO_PROCESS_ID=str(index),
    )
    if devices_per_process is not None:
        flags = with_cpu_device_count(env.get("XLA_FLAGS", ""), devices_per_process)
        env["XLA_FLAGS"] = with_default(flags, CPU_COLLECTIVE_TIMEOUT_FLAG)
        env.setdefault("JAX_PLATFORMS", "cpu")
    return env


def launch_local(
    command: Sequence[str],
    num_processes: int,
    *,
    devices_per_process: int | None = 2,
    logs: str | os.PathLike | None = None,
    timeout_s: float | None = None,
    env: Mapping[str, str] | None = None,
    cwd: str | os.PathLike | None = None,
) -> LocalJobResult:
    """Start `num_processes` copies of `command` as one job and wait for all of them.

    devices_per_process: fake CPU devices per process (None: leave the platform alone, e.g.
      several GPUs split with `SAO_LOCAL_DEVICE_IDS` by the caller).
    logs: directory of `process<i>.log` (None: every process writes to this terminal).
    timeout_s: stop every process after this long (None: wait as long as they run).
    """
    if num_processes < 1:
        raise ValueError(f"num_processes must be >= 1, got {num_processes}")
    if not command:
        raise ValueError("give the command to run after --")
    base = dict(os.environ if env is None else env)
    coordinator = f"127.0.0.1:{free_port()}"
    log_dir = Path(logs) if logs is not None else None
    if log_dir is not None:
        log_dir.mkdir(parents=True, exist_ok=True)
    running: list[subprocess.Popen] = []
    paths: list[Path | None] = []
    timed_out = False
    try:
        for index in range(num_processes):
            path = log_dir / f"process{index}.log" if log_dir is not None else None
            out = path.open("w") if path is not None else None
            try:
                running.append(
                    subprocess.Popen(
                        list(command),
                        env=process_environment(
                            index, num_processes, coordinator, devices_per_process, base
                        ),
                        stdout=out,
                        stderr=subprocess.STDOUT if out is not None else None,
                        cwd=cwd,
                    )
                )
            finally:
                if out is not None:
                    out.close()  # the child holds its own descriptor
            paths.append(path)
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while any(p.poll() is None for p in running):
            if any(p.poll() not in (None, 0) for p in running):
                break  # one failed: its peers would wait for it in a collective
            if deadline is not None and time.monotonic() > deadline:
                timed_out = True
                break
            time.sleep(0.2)
    finally:
        for process in running:
            if process.poll() is None:
                process.kill()
                process.wait()
    return LocalJobResult(tuple(p.returncode for p in running), tuple(paths), timed_out)


@dataclasses.dataclass
class LaunchConfig:
    """`python -m sao_jax.distributed.local_launch [fields] -- COMMAND ...`

    Attributes:
      num_processes: processes in the job.
      devices_per_process: fake CPU devices per process; 0: leave the platform's devices alone.
      logs: directory of process<i>.log (none: every process writes to this terminal).
      timeout_s: stop every process after this long (none: wait as long as they run).
      command: the command every process runs (after --).
    """

    num_processes: int = 2
    devices_per_process: int = 2
    logs: str | None = None
    timeout_s: float | None = None
    command: list[str] = dataclasses.field(default_factory=list, metadata={"remainder": True})


def main(argv: Sequence[str] | None = None) -> int:
    config = parse_cli(
        argv,
        LaunchConfig,
        prog="python -m sao_jax.distributed.local_launch",
        description=__doc__.split("\n")[0],
    )
    if not config.command:
        print("usage: ... local_launch [options] -- COMMAND ...", file=sys.stderr)
        return 2
    result = launch_local(
        config.command,
        config.num_processes,
        devices_per_process=config.devices_per_process or None,
        logs=config.logs,
        timeout_s=config.timeout_s,
    )
    if not result.ok:
        print(result.describe(), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
