"""The control plane's decision log: one JSON line per analysis, gate result, decision,
promotion, canary, watch and rollback, refused ones included.

Kept next to the composite store (`<store root>/decisions.jsonl`, i.e.
STATE_DIR/composites/decisions.jsonl), append-only: each line is written, flushed and fsynced
before the call that made it returns, so an action that shipped is never missing from it.
Every line has `time`, `event` (one of `EVENTS`) and `tenant`, then the event's evidence.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

from serving.common.jsonl import append_entry, drop_torn_tail, read_entries
from serving.control.store import ControlError

DECISIONS_FILE = "decisions.jsonl"
EVENTS = (
    "analysis",
    "gate",
    "decision",
    "promote",
    "refused",
    "canary_start",
    "canary_stop",
    "watch",
    "rollback",
)


class DecisionLog:
    """Append-only JSON lines at `<root>/decisions.jsonl` (thread-safe within one process)."""

    def __init__(self, root: str | Path):
        self.path = Path(root) / DECISIONS_FILE
        self.path.parent.mkdir(parents=True, exist_ok=True)
        drop_torn_tail(self.path)  # else the next entry would be glued onto it
        self._lock = threading.Lock()

    def record(self, event: str, tenant: str, **entry: Any) -> dict[str, Any]:
        """Append one entry; returns it as written."""
        if event not in EVENTS:
            raise ControlError(f"unknown decision-log event {event!r}; one of {list(EVENTS)}")
        line = {"time": time.time(), "event": event, "tenant": tenant, **entry}
        with self._lock, open(self.path, "a", encoding="utf-8") as f:
            append_entry(f, line, default=str, ensure_ascii=False, sort_keys=True)
        return line

    def entries(self, tenant: str | None = None, event: str | None = None) -> list[dict[str, Any]]:
        """Entries oldest first, optionally of one tenant / event (a torn last line is
        skipped: the write it belonged to never returned)."""
        return [
            entry
            for entry in read_entries(self.path)
            if (tenant is None or entry.get("tenant") == tenant)
            and (event is None or entry.get("event") == event)
        ]
