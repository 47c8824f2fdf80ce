"""Canaries: a tenant's newest composite version served to a share of its sessions only.

A canary runs the tenant's newest version (the candidate, stored as any version) for `share`
of its sessions and the `baseline` version (by default the candidate's parent) for the rest.
The split is a deterministic hash of the session id: a session is in the canary when
sha256(salt, session id), read as a number in [0, 1), is below `share`, so every call of a
session is served by the same version, and the gateway, a test or an analysis can recompute
who got what (`serves_candidate`). Every event records the version that actually served it
(`composite_version`), so the canary's two arms are told apart in any window.

`CanaryBook` keeps at most one canary per tenant, `<store root>/<tenant>/canary.json`, written
atomically. Stopping a canary leaves the newest version serving everyone (promotion); to drop
the candidate instead, roll back to the baseline (`deploy.finish_canary`). A version stored
after the canary started supersedes it: the canary is then ignored.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from atdp_io.schema import SchemaError, check_tenant_id
from serving.control.composite import CompositePolicy
from serving.control.store import CompositeStore, ControlError, InvalidTenant, UnknownVersion

CANARY_FILE = "canary.json"


class CanaryError(ControlError):
    """A canary that cannot be started or stopped as asked."""


@dataclasses.dataclass(frozen=True)
class Canary:
    """version: the candidate (the tenant's newest version when started); baseline: the
    version the other sessions get; share: the fraction of sessions in the canary, in (0, 1);
    salt: mixed into the session hash (a fresh split per canary)."""

    tenant: str
    version: int
    baseline: int
    share: float
    salt: str
    started_at: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Canary:
        return cls(**{f.name: data[f.name] for f in dataclasses.fields(cls)})


def session_bucket(session_id: str, salt: str) -> float:
    """The session's place in [0, 1): the first 8 bytes of sha256(salt, session id)."""
    digest = hashlib.sha256(f"{salt}\n{session_id}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2.0**64


def serves_candidate(canary: Canary, session_id: str) -> bool:
    """Whether the canary's candidate version serves this session."""
    return session_bucket(session_id, canary.salt) < canary.share


class CanaryBook:
    """The active canaries of a composite store's tenants (one process writes them)."""

    def __init__(self, store: CompositeStore):
        self.store = store
        self._lock = threading.Lock()
        # tenant -> (its canary or None, the baseline composite) as last read or written
        self._cache: dict[str, tuple[Canary | None, CompositePolicy | None]] = {}

    def _path(self, tenant: str) -> Path:
        try:
            check_tenant_id(tenant)
        except SchemaError as error:
            raise InvalidTenant(f"invalid tenant {tenant!r}: {error}") from None
        return self.store.root / tenant / CANARY_FILE

    def get(self, tenant: str) -> Canary | None:
        """The tenant's canary (None: none running)."""
        return self._entry(tenant)[0]

    def _entry(self, tenant: str) -> tuple[Canary | None, CompositePolicy | None]:
        cached = self._cache.get(tenant)
        if cached is not None:
            return cached
        with self._lock:
            path = self._path(tenant)
            canary = baseline = None
            if path.exists():
                try:
                    canary = Canary.from_json(json.loads(path.read_text(encoding="utf-8")))
                except (OSError, ValueError, KeyError, TypeError) as error:
                    raise ControlError(f"{path}: unreadable canary ({error})") from None
                baseline = self.store.get(tenant, canary.baseline)
            self._cache[tenant] = (canary, baseline)
            return canary, baseline

    def start(
        self,
        tenant: str,
        *,
        share: float,
        version: int | None = None,
        baseline: int | None = None,
        salt: str | None = None,
    ) -> Canary:
        """Serve `version` (default: the newest; it must be the newest) to `share` of the
        sessions and `baseline` (default: its parent) to the rest."""
        if isinstance(share, bool) or not isinstance(share, int | float):
            raise CanaryError(f"canary share must be a number in (0, 1), got {share!r}")
        if not (math.isfinite(share) and 0.0 < share < 1.0):
            raise CanaryError(f"canary share must be in (0, 1), got {share}")
        current = self.store.current(tenant)
        version = current.version if version is None else version
        if version != current.version or version == 0:
            raise CanaryError(
                f"a canary runs the tenant's newest version ({current.version}), not {version}; "
                "store the candidate first"
            )
        running = self.get(tenant)
        if running is not None and running.version == current.version:
            raise CanaryError(
                f"a canary of version {running.version} is already running for {tenant!r}; "
                "stop it first"
            )
        baseline = current.parent if baseline is None else baseline
        if baseline is None or baseline >= version:
            raise UnknownVersion(f"a canary's baseline must be earlier than {version}")
        baseline_composite = self.store.get(tenant, baseline)  # UnknownVersion if not stored
        canary = Canary(
            tenant, version, baseline, float(share), salt or f"{tenant}-v{version}", time.time()
        )
        with self._lock:
            self._write(self._path(tenant), canary.to_json())
            self._cache[tenant] = (canary, baseline_composite)
        return canary

    def stop(self, tenant: str) -> Canary:
        """End the tenant's canary (its newest version then serves every session)."""
        canary = self.get(tenant)
        if canary is None:
            raise CanaryError(f"tenant {tenant!r} has no canary running")
        with self._lock:
            self._path(tenant).unlink(missing_ok=True)
            self._cache[tenant] = (None, None)
        return canary

    def serving(self, tenant: str, session_id: str) -> CompositePolicy:
        """The composite that serves this session of the tenant now."""
        current = self.store.current(tenant)
        canary, baseline = self._entry(tenant)
        if canary is None or canary.version != current.version or baseline is None:
            return current
        return current if serves_candidate(canary, session_id) else baseline

    @staticmethod
    def _write(path: Path, data: dict[str, Any]) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".canary-", dir=path.parent)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump(data, f, sort_keys=True)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            os.unlink(tmp)
            raise
