"""Append-only JSON-lines files that survive a crash mid-write.

Each entry is one line, written, flushed and fsynced before the caller answers anyone, so a
`kill -9` can only leave a torn *last* line: an entry whose write never returned. Opening such a
file for appending first cuts that torn tail off; otherwise the next entry would be written onto
the end of the torn one and the two would be unreadable together (a lost acknowledged entry).
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any, TextIO

logger = logging.getLogger(__name__)


def drop_torn_tail(path: str | Path) -> int:
    """Cuts `path` back to its last complete line; returns the bytes removed (0 if none)."""
    path = Path(path)
    if not path.exists():
        return 0
    with open(path, "rb+") as f:
        size = f.seek(0, os.SEEK_END)
        if size == 0:
            return 0
        f.seek(size - 1)
        if f.read(1) == b"\n":
            return 0
        keep = _end_of_last_line(f, size)
        f.truncate(keep)
        f.flush()
        os.fsync(f.fileno())
    logger.warning("%s ended in a torn line (a crash mid-write); cut %d bytes", path, size - keep)
    return size - keep


def _end_of_last_line(f, size: int, block: int = 1 << 16) -> int:
    """Offset just past the last newline of the open file `f` (0 if it has none)."""
    end = size
    while end > 0:
        start = max(0, end - block)
        f.seek(start)
        newline = f.read(end - start).rfind(b"\n")
        if newline >= 0:
            return start + newline + 1
        end = start
    return 0


def open_for_append(path: str | Path) -> TextIO:
    """The file at `path` opened for appending entries, its torn tail (if any) cut first."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    drop_torn_tail(path)
    return open(path, "a", encoding="utf-8")


def append_entry(file: TextIO, entry: Any, **dumps: Any) -> None:
    """Writes `entry` as one JSON line and makes it durable before returning."""
    file.write(json.dumps(entry, **dumps) + "\n")
    file.flush()
    os.fsync(file.fileno())


def read_entries(path: str | Path) -> list[Any]:
    """Every complete entry, oldest first (a torn last line is skipped: its write never
    returned)."""
    path = Path(path)
    if not path.exists():
        return []
    out = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            logger.warning("%s:%d is torn (a crash mid-write); skipped", path, number)
    return out
