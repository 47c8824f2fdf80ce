"""Edit an `XLA_FLAGS` string: the fake CPU device count and flags with defaults.

Plain string work with no JAX import, so a launcher, a test's conftest or a benchmark can set
the flags before JAX starts its backend. A CPU process sees one device unless
`--xla_force_host_platform_device_count=N` asks for N (threads that stand in for chips).
"""

from __future__ import annotations

DEVICE_COUNT_FLAG = "--xla_force_host_platform_device_count"


def _name(flag: str) -> str:
    return flag.split("=", 1)[0]


def with_cpu_device_count(xla_flags: str, count: int | None) -> str:
    """`xla_flags` with its fake CPU device count set to `count` (None: the flag removed, one
    device), every other flag kept in order."""
    if count is not None and count < 1:
        raise ValueError(f"a CPU device count must be >= 1, got {count}")
    flags = [f for f in xla_flags.split() if _name(f) != DEVICE_COUNT_FLAG]
    if count is not None:
        flags.append(f"{DEVICE_COUNT_FLAG}={count}")
    return " ".join(flags)


def cpu_device_count(xla_flags: str) -> int | None:
    """The fake CPU device count `xla_flags` asks for (the last one given), or None."""
    counts = [f.split("=", 1)[1] for f in xla_flags.split() if _name(f) == DEVICE_COUNT_FLAG]
    return int(counts[-1]) if counts else None


def with_default(xla_flags: str, flag: str) -> str:
    """`xla_flags` plus `flag` ("--name=value") unless a value for that name is already set."""
    if any(_name(f) == _name(flag) for f in xla_flags.split()):
        return xla_flags
    return " ".join([*xla_flags.split(), flag])
