"""The gateway's audit log of data-rights calls (deletion, consent withdrawal).

Every call to those routes, refused ones included, is one JSON line in
`<state_dir>/audit.jsonl` (appended and fsynced before the answer is sent): when, which route,
who (admin / tenant name / session / unauthenticated), the body's tenant and selector, the
status answered and the trajectories affected. Calls that reach the store are also audited in
the tenant's own ATDP audit log (`AtdpStore.audit_log`); this file adds the refused ones, which
never reach a partition.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

from serving.common.jsonl import append_entry, open_for_append, read_entries

AUDIT_FILE = "audit.jsonl"


class GatewayAudit:
    """Append-only JSON lines under `state_dir`."""

    def __init__(self, state_dir: str | Path):
        self.path = Path(state_dir) / AUDIT_FILE
        self._lock = threading.Lock()
        self._file = open_for_append(self.path)

    def record(self, **entry: Any) -> None:
        with self._lock:
            append_entry(
                self._file, {"time": time.time(), **entry}, default=str, ensure_ascii=False
            )

    def entries(self) -> list[dict[str, Any]]:
        """Every entry so far, oldest first (a torn last line is skipped)."""
        return read_entries(self.path)

    def close(self) -> None:
        self._file.close()
