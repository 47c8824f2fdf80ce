"""Multi-controller start-up: `jax.distributed` from the environment or flags, process facts.

Every host of a multi-host job runs the same program; `initialize()` must run in each before
anything touches a device. It joins the processes into one JAX runtime only when there is more
than one of them:

- explicit: `SAO_COORDINATOR_ADDRESS` (host:port of process 0), `SAO_NUM_PROCESSES`,
  `SAO_PROCESS_ID` (JAX's own `JAX_COORDINATOR_ADDRESS` / `JAX_NUM_PROCESSES` /
  `JAX_PROCESS_ID` are read too), or the flags `--coordinator_address`, `--num_processes`,
  `--process_id` (flags win over the environment);
- a Cloud TPU VM with none of those set: JAX's own cluster detection (TPU metadata, and the
  `MEGASCALE_*` variables of a multi-slice job) finds the coordinator, count and id.

A single process (the laptop and CPU-test case) initialises nothing. After `initialize`,
`jax.devices()` lists every process's devices, so meshes built from it span the job.
"""

from __future__ import annotations

import dataclasses
import glob
import os
from collections.abc import Mapping, Sequence
from pathlib import Path

import jax

from sao_jax.config_cli import apply_overrides, split_known

# (our variable, JAX's own) per field; ours win when both are set.
_ENV = {
    "coordinator_address": ("SAO_COORDINATOR_ADDRESS", "JAX_COORDINATOR_ADDRESS"),
    "num_processes": ("SAO_NUM_PROCESSES", "JAX_NUM_PROCESSES"),
    "process_id": ("SAO_PROCESS_ID", "JAX_PROCESS_ID"),
    "local_device_ids": ("SAO_LOCAL_DEVICE_IDS", "JAX_LOCAL_DEVICE_IDS"),
}
# Set on Cloud TPU VMs and GKE TPU pods (worker id / host list / multi-slice coordinator).
_TPU_ENV = (
    "TPU_WORKER_ID",
    "TPU_WORKER_HOSTNAMES",
    "TPU_PROCESS_ADDRESSES",
    "TPU_ACCELERATOR_TYPE",
    "MEGASCALE_COORDINATOR_ADDRESS",
)
_GOOGLE_PCI_VENDOR = "0x1ae0"


@dataclasses.dataclass(frozen=True)
class DistributedConfig:
    """How this process joins a multi-process job (None fields: not given).

    Attributes:
      coordinator_address: "host:port" of process 0's coordinator service.
      num_processes: processes in the job (one per host on a TPU pod).
      process_id: this process's rank in [0, num_processes).
      local_device_ids: the local devices this process drives (default: all).
      initialization_timeout_s: how long to wait for every process to join.
      tpu_auto_detect: on a Cloud TPU VM without explicit settings, let JAX discover them.
    """

    coordinator_address: str | None = None
    num_processes: int | None = None
    process_id: int | None = None
    local_device_ids: tuple[int, ...] | None = None
    initialization_timeout_s: int = 300
    tpu_auto_detect: bool = True

    def __post_init__(self):
        if self.num_processes is not None and self.num_processes < 1:
            raise ValueError(f"num_processes must be >= 1, got {self.num_processes}")
        if self.process_id is not None:
            if self.num_processes is None:
                raise ValueError("process_id is set but num_processes is not")
            if not 0 <= self.process_id < self.num_processes:
                raise ValueError(
                    f"process_id {self.process_id} is outside [0, {self.num_processes})"
                )
        explicit = self.num_processes is not None and self.num_processes > 1
        if explicit and (self.coordinator_address is None or self.process_id is None):
            missing = [
                name
                for name in ("coordinator_address", "process_id")
                if getattr(self, name) is None
            ]
            raise ValueError(f"num_processes={self.num_processes} also needs {missing}")
        if self.coordinator_address is not None and ":" not in self.coordinator_address:
            raise ValueError(
                f"coordinator_address must be host:port, got {self.coordinator_address!r}"
            )

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> DistributedConfig:
        """Settings from `SAO_*` (or `JAX_*`) variables; a malformed one names itself."""
        environ = os.environ if environ is None else environ
        values: dict = {}
        for field, names in _ENV.items():
            name = next((n for n in names if environ.get(n, "").strip()), None)
            if name is None:
                continue
            raw = environ[name].strip()
            try:
                if field == "coordinator_address":
                    values[field] = raw
                elif field == "local_device_ids":
                    values[field] = tuple(int(i) for i in raw.split(","))
                else:
                    values[field] = int(raw)
            except ValueError as error:
                raise ValueError(f"{name}={raw!r} is not valid: {error}") from error
        try:
            return cls(**values)
        except ValueError as error:
            raise ValueError(f"distributed settings from the environment: {error}") from error


FLAGS = ("coordinator_address", "num_processes", "process_id")


def split_flags(argv: Sequence[str]) -> tuple[DistributedConfig, list[str]]:
    """The distributed settings (environment, then the `FLAGS` in `argv`: `--process_id 1`,
    `--process-id=1` or `process_id=1`) and the other arguments.

    Lets an entry point with its own config (e.g. `config_cli.parse_cli`) accept the flags too.
    """
    overrides, rest = split_known(argv, FLAGS)
    return apply_overrides(DistributedConfig.from_env(), overrides), rest


def on_cloud_tpu_vm(
    environ: Mapping[str, str] | None = None, pci_root: str = "/sys/bus/pci/devices"
) -> bool:
    """Whether this host is a Cloud TPU VM: a TPU runtime variable is set or a Google TPU PCI
    device is present (no network call)."""
    environ = os.environ if environ is None else environ
    if any(environ.get(name) for name in _TPU_ENV):
        return True
    for vendor in glob.glob(os.path.join(pci_root, "*", "vendor")):
        try:
            if Path(vendor).read_text().strip() == _GOOGLE_PCI_VENDOR:
                return True
        except OSError:
            continue
    return False


def initialization_mode(
    config: DistributedConfig, environ: Mapping[str, str] | None = None, **tpu_probe
) -> str | None:
    """ "explicit" (several processes named), "tpu_auto" (a TPU VM left to JAX's detection),
    or None (a single process: nothing to initialise)."""
    if config.num_processes is not None:
        return "explicit" if config.num_processes > 1 else None
    if config.coordinator_address is not None:
        raise ValueError("coordinator_address is set but num_processes is not")
    if config.tpu_auto_detect and on_cloud_tpu_vm(environ, **tpu_probe):
        return "tpu_auto"
    return None


@dataclasses.dataclass(frozen=True)
class ProcessInfo:
    """Where this process stands in the job."""

    process_index: int
    process_count: int
    local_device_count: int
    device_count: int
    platform: str
    mode: str | None  # how jax.distributed was initialised (None: single process)

    @property
    def is_coordinator(self) -> bool:
        """Process 0: the one that logs, writes summaries and prints."""
        return self.process_index == 0


_MODE: list[str | None] = [None]
_INITIALIZED: list[bool] = [False]


def initialize(config: DistributedConfig | None = None) -> ProcessInfo:
    """Join the multi-process job if there is one (idempotent); returns this process's facts.

    `config` defaults to `DistributedConfig.from_env()`. Call before any other JAX use.
    """
    config = DistributedConfig.from_env() if config is None else config
    if not _INITIALIZED[0]:
        mode = initialization_mode(config)
        if mode == "explicit":
            jax.distributed.initialize(
                coordinator_address=config.coordinator_address,
                num_processes=config.num_processes,
                process_id=config.process_id,
                local_device_ids=list(config.local_device_ids)
                if config.local_device_ids is not None
                else None,
                initialization_timeout=config.initialization_timeout_s,
            )
        elif mode == "tpu_auto":
            jax.distributed.initialize(initialization_timeout=config.initialization_timeout_s)
        _MODE[0] = mode
        _INITIALIZED[0] = True
    return process_info()


def process_info() -> ProcessInfo:
    """This process's index, the process and device counts, and the platform."""
    return ProcessInfo(
        process_index=jax.process_index(),
        process_count=jax.process_count(),
        local_device_count=jax.local_device_count(),
        device_count=jax.device_count(),
        platform=jax.default_backend(),
        mode=_MODE[0],
    )


def is_coordinator() -> bool:
    """Whether this is process 0 (the one that logs and writes summaries)."""
    return jax.process_index() == 0


def barrier(name: str) -> None:
    """Block until every process reaches the barrier `name` (no-op with one process)."""
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils

        multihost_utils.sync_global_devices(name)


def shutdown() -> None:
    """Leave the job (all processes must call it; a no-op when nothing was initialised)."""
    if _MODE[0] is not None:
        jax.distributed.shutdown()
    _MODE[0] = None
    _INITIALIZED[0] = False
