"""The single-writer lock of a partition on local files.

An advisory `flock` on `<partition>/writer.lock`: the kernel drops it when the process dies, so a
writer killed with `kill -9` never blocks its successor. Remote kvstores have no such lock; there
the head's compare-and-swap fences a second writer (see writer.py).
"""

from __future__ import annotations

import errno
import fcntl
import os
from collections.abc import Mapping
from typing import IO, Any

from atdp_io import layout


class PartitionLockedError(RuntimeError):
    """Another live writer holds the partition's lock."""


def acquire_writer_lock(partition: Mapping[str, Any], tenant: str) -> IO | None:
    """Takes the partition's writer lock; None for kvstores without local files."""
    path = layout.local_path(partition)
    if path is None:
        return None  # remote kvstores: the head compare-and-swap fences a second writer
    os.makedirs(path, exist_ok=True)
    handle = open(os.path.join(path, "writer.lock"), "a+")  # noqa: SIM115 (held for the writer's life)
    try:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as err:
        handle.close()
        if err.errno in (errno.EAGAIN, errno.EACCES):
            raise PartitionLockedError(
                f"partition {tenant!r} already has a live writer (lock {path}writer.lock)"
            ) from None
        raise
    return handle


def release_writer_lock(handle: IO | None) -> None:
    if handle is not None:
        fcntl.flock(handle.fileno(), fcntl.LOCK_UN)
        handle.close()
