"""The gateway's audit log of data-rights calls (deletion, consent withdrawal).

Every call to those routes, refused ones included, is one JSON line in
`<state_dir>/audit.jsonl` (appended and fsynced before the answer is sent): when, which route,
who (admin / tenant name / session / unauthenticated), the body's tenant and selector, the
status answered and the trajectories affected. Calls that reach the store are also audited in
the tenant's own ATDP audit log (`AtdpStore.audit_log`); this file adds the refused ones, which
never reach a partition.
"""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path
from typing import Any

AUDIT_FILE = "audit.jsonl"


class GatewayAudit:
    """Append-only JSON lines under `state_dir`."""

    def __init__(self, state_dir: str | Path):
        self.path = Path(state_dir) / AUDIT_FILE
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._file = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 (kept open)

    def record(self, **entry: Any) -> None:
        line = json.dumps({"time": time.time(), **entry}, default=str, ensure_ascii=False)
        with self._lock:
            self._file.write(line + "\n")
            self._file.flush()
            os.fsync(self._file.fileno())

    def entries(self) -> list[dict[str, Any]]:
        """Every entry so far, oldest first (a torn last line is skipped)."""
        out = []
        for line in self.path.read_text(encoding="utf-8").splitlines():
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                continue
        return out

    def close(self) -> None:
        self._file.close()
