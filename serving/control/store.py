"""Versioned composites on disk: one append-only history per tenant.

Layout: `<root>/<tenant>/v000001.json`, one JSON file per version (`CompositePolicy.to_json`).
A version file is written to a temporary file, fsynced, then hard-linked to its final name,
which fails if the name exists: a version is never overwritten, not even by a second writer
racing for the same number (it gets a `VersionConflict`). Version 0 is every tenant's empty
composite and is never stored. A rollback writes a new version whose content equals the
earlier one, so history only grows.

Errors: `InvalidTenant` (not a valid tenant id), `UnknownVersion`, `VersionConflict` (a put
that expected another current version), `CompositeError` (malformed content); all are
`ControlError`s with a message that says what to do.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from atdp_io.schema import SchemaError, check_tenant_id
from serving.control.composite import CompositeError, CompositePolicy, CompositeSpec, diff

_VERSION_FILE = re.compile(r"^v(\d{6,})\.json$")


class ControlError(Exception):
    """A control-plane request that cannot be served as asked."""


class InvalidTenant(ControlError):
    pass


class UnknownVersion(ControlError):
    pass


class VersionConflict(ControlError):
    pass


def empty(tenant: str) -> CompositePolicy:
    """Version 0: the composite of a tenant nothing was ever put for (applies nothing)."""
    return CompositePolicy(tenant=tenant, version=0, spec=CompositeSpec())


class CompositeStore:
    """Per-tenant composite histories under `root` (thread-safe within one process; one
    process writes a root)."""

    def __init__(self, root: str | Path):
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._current: dict[str, CompositePolicy] = {}

    def _dir(self, tenant: str) -> Path:
        try:
            check_tenant_id(tenant)
        except SchemaError as error:
            raise InvalidTenant(f"invalid tenant {tenant!r}: {error}") from None
        return self.root / tenant

    def _versions(self, tenant: str) -> list[int]:
        directory = self._dir(tenant)
        if not directory.is_dir():
            return []
        found = (_VERSION_FILE.match(p.name) for p in directory.iterdir())
        return sorted(int(m.group(1)) for m in found if m)

    def _read(self, tenant: str, version: int) -> CompositePolicy:
        path = self._dir(tenant) / f"v{version:06d}.json"
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            return CompositePolicy.from_json(data, str(path))
        except (OSError, ValueError, KeyError, TypeError) as error:  # CompositeError included
            raise ControlError(
                f"{path}: unreadable composite version ({error}); version files are written "
                "only by the store and must not be edited"
            ) from None

    # ------------------------------------------------------------------ reading

    def tenants(self) -> list[str]:
        """Tenants with at least one stored version."""
        return sorted(p.name for p in self.root.iterdir() if p.is_dir() and any(p.glob("v*.json")))

    def current(self, tenant: str) -> CompositePolicy:
        """The tenant's newest version (version 0, the empty composite, if none)."""
        cached = self._current.get(tenant)
        if cached is not None:
            return cached
        with self._lock:
            versions = self._versions(tenant)
            composite = self._read(tenant, versions[-1]) if versions else empty(tenant)
            self._current[tenant] = composite
            return composite

    def get(self, tenant: str, version: int) -> CompositePolicy:
        if isinstance(version, bool) or not isinstance(version, int):
            raise UnknownVersion(f"a composite version is an integer, got {version!r}")
        if version == 0:
            self._dir(tenant)
            return empty(tenant)
        versions = self._versions(tenant)
        if version not in versions:
            latest = versions[-1] if versions else 0
            raise UnknownVersion(
                f"tenant {tenant!r} has no composite version {version}; its versions are "
                f"0 to {latest}"
            )
        return self._read(tenant, version)

    def history(self, tenant: str) -> list[CompositePolicy]:
        """Every stored version, oldest first (version 0 not included)."""
        return [self._read(tenant, v) for v in self._versions(tenant)]

    def diff(self, tenant: str, old: int, new: int) -> dict[str, Any]:
        return diff(self.get(tenant, old), self.get(tenant, new))

    # ------------------------------------------------------------------ writing

    def put(
        self,
        tenant: str,
        spec: CompositeSpec | dict[str, Any],
        *,
        reason: str = "",
        expected_version: int | None = None,
        rollback_of: int | None = None,
    ) -> CompositePolicy:
        """Store `spec` as the tenant's next version (previous + 1, parent = previous).
        `expected_version`: refuse (VersionConflict) unless it is still the current one."""
        if not isinstance(spec, CompositeSpec):
            spec = CompositeSpec.from_json(spec)
        if not isinstance(reason, str):
            raise CompositeError("reason: expected a string")
        with self._lock:
            directory = self._dir(tenant)
            versions = self._versions(tenant)
            previous = versions[-1] if versions else 0
            if expected_version is not None and expected_version != previous:
                raise VersionConflict(
                    f"tenant {tenant!r} is at composite version {previous}, not "
                    f"{expected_version}; read it again and retry"
                )
            composite = CompositePolicy(
                tenant=tenant,
                version=previous + 1,
                spec=spec,
                parent=previous,
                created_at=time.time(),
                reason=reason,
                rollback_of=rollback_of,
            )
            directory.mkdir(parents=True, exist_ok=True)
            self._write_new(directory / f"v{composite.version:06d}.json", composite.to_json())
            self._current[tenant] = composite
            return composite

    def rollback(self, tenant: str, version: int, *, reason: str = "") -> CompositePolicy:
        """A new version whose content is that of `version` (an earlier one)."""
        target = self.get(tenant, version)
        current = self.current(tenant)
        if version >= current.version:
            raise UnknownVersion(
                f"can only roll back to an earlier version than the current {current.version}, "
                f"not {version}"
            )
        return self.put(
            tenant,
            target.spec,
            reason=reason or f"rollback to version {version}",
            expected_version=current.version,
            rollback_of=version,
        )

    @staticmethod
    def _write_new(path: Path, data: dict[str, Any]) -> None:
        """Write `path` durably, failing if it exists (never overwrite a version)."""
        fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=path.parent)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump(data, f, indent=1, sort_keys=True, ensure_ascii=False)
                f.flush()
                os.fsync(f.fileno())
            try:
                os.link(tmp, path)
            except FileExistsError:
                raise VersionConflict(
                    f"{path.name} was written by someone else meanwhile"
                ) from None
        finally:
            os.unlink(tmp)
        dir_fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
