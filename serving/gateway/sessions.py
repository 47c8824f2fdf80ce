"""The gateway's session table: session ids, their tenant, key digest and data proxy.

Session keys are `secrets.token_urlsafe(32)` (256 bits); only their sha256 digests are kept.
The table is an append-only JSON-lines file (fsynced per change) replayed at startup, so
agents keep using their session keys across a gateway restart. A torn last line (a crash
mid-write) is skipped and cut off before the next append: the session it described was never
acknowledged.
"""

from __future__ import annotations

import dataclasses
import logging
import secrets
import threading
import time
from pathlib import Path
from typing import Any

from serving.common.http import key_digest
from serving.common.ids import opaque_id
from serving.common.jsonl import append_entry, open_for_append, read_entries

logger = logging.getLogger(__name__)

SESSION_KEY_PREFIX = "sk-sess-"
TABLE_FILE = "sessions.jsonl"


@dataclasses.dataclass
class SessionRecord:
    session_id: str
    tenant: str
    key_digest: str
    proxy: str
    created_at: float
    task: dict[str, Any]
    ended: bool = False


class SessionTable:
    """Sessions by id and by key digest, persisted under `state_dir`."""

    def __init__(self, state_dir: str | Path):
        self.path = Path(state_dir) / TABLE_FILE
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._by_id: dict[str, SessionRecord] = {}
        self._by_digest: dict[str, str] = {}
        self._lock = threading.Lock()
        self._load()
        self._file = open_for_append(self.path)

    def _load(self) -> None:
        for entry in read_entries(self.path):
            if entry.get("op") == "start":
                record = SessionRecord(**entry["session"])
                self._by_id[record.session_id] = record
                self._by_digest[record.key_digest] = record.session_id
            elif entry.get("op") == "end" and entry.get("session_id") in self._by_id:
                self._by_id[entry["session_id"]].ended = True

    def _append(self, entry: dict[str, Any]) -> None:
        with self._lock:
            append_entry(self._file, entry)

    def create(self, tenant: str, proxy: str, task: dict[str, Any]) -> tuple[SessionRecord, str]:
        """A new session and its key (the only time the key itself is seen)."""
        session_id = opaque_id()
        key = SESSION_KEY_PREFIX + secrets.token_urlsafe(32)
        record = SessionRecord(session_id, tenant, key_digest(key), proxy, time.time(), dict(task))
        return record, key

    def commit(self, record: SessionRecord) -> None:
        """Persist a created session (after its trajectory was opened)."""
        self._append({"op": "start", "session": dataclasses.asdict(record)})
        self._by_id[record.session_id] = record
        self._by_digest[record.key_digest] = record.session_id

    def end(self, record: SessionRecord) -> None:
        self._append({"op": "end", "session_id": record.session_id, "time": time.time()})
        record.ended = True

    def by_key(self, key: str) -> SessionRecord | None:
        session_id = self._by_digest.get(key_digest(key))
        return None if session_id is None else self._by_id[session_id]

    def get(self, session_id: str) -> SessionRecord | None:
        return self._by_id.get(session_id)

    def tenants(self) -> list[str]:
        return sorted({r.tenant for r in self._by_id.values()})

    def __len__(self) -> int:
        return len(self._by_id)

    def close(self) -> None:
        self._file.close()
