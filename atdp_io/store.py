"""`AtdpStore`: the entry point to an ATDP buffer on any TensorStore kvstore.

```python
store = AtdpStore.open("/data/atdp")              # or "gs://bucket/atdp", or a kvstore spec
with store.writer("acme") as writer:              # one writer per tenant partition
    writer.append([trajectory])                   # durable on return
reader = store.reader("acme", principal="acme")   # another principal needs a grant
reader.refresh()
trajectory = reader.read(reader.trajectory_ids()[0])
```
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from collections.abc import Callable, Mapping
from typing import Any

import tensorstore as ts

from atdp_io import layout, lineage
from atdp_io.access import AccessControl, AccessDenied, Grant
from atdp_io.governance import is_expired
from atdp_io.reader import PartitionReader
from atdp_io.redaction import Redactor
from atdp_io.schema import check_tenant_id
from atdp_io.writer import PartitionWriter

_MARKER = "atdp.json"


class AtdpStore:
    """A root holding isolated tenant partitions, their grants and audit logs."""

    def __init__(
        self,
        root: Mapping[str, Any],
        config: layout.StoreConfig,
        clock: Callable[[], float] = time.time,
        context: ts.Context | None = None,
    ):
        self.root = dict(root)
        self.config = config
        self.clock = clock
        # One context for every handle: shares I/O resources, and makes the in-process "memory"
        # kvstore one store rather than one per handle.
        self.context = context or ts.Context()
        self.access = AccessControl(self.root, clock, self.context)
        self._kvstore = ts.KvStore.open(self.root, context=self.context).result()

    @classmethod
    def open(
        cls,
        location: str | os.PathLike | Mapping[str, Any],
        *,
        config: layout.StoreConfig | None = None,
        create: bool = True,
        clock: Callable[[], float] = time.time,
        context: ts.Context | None = None,
    ) -> AtdpStore:
        """Opens (or with `create`, creates) a store; `config` applies only at creation."""
        root = layout.kvstore_spec(location)
        context = context or ts.Context()
        kvstore = ts.KvStore.open(root, context=context).result()
        raw, _ = layout.read_key(kvstore, _MARKER)
        if raw is None:
            if not create:
                raise FileNotFoundError(f"no ATDP store at {location!r} (missing {_MARKER})")
            config = config or layout.StoreConfig()
            marker = {"format": "atdp-store", "format_version": layout.FORMAT_VERSION}
            marker["config"] = dataclasses.asdict(config)
            # Create-if-absent: of two processes creating a store at once, one marker wins.
            marker_bytes = json.dumps(marker).encode()
            kvstore.write(_MARKER, marker_bytes, if_equal=layout.MISSING_GENERATION).result()
            raw, _ = layout.read_key(kvstore, _MARKER)
        marker = json.loads(raw)
        if marker.get("format") != "atdp-store":
            raise ValueError(f"{location!r}: {_MARKER} is not an ATDP store marker")
        if marker.get("format_version") != layout.FORMAT_VERSION:
            raise ValueError(
                f"{location!r}: store format {marker.get('format_version')} is not supported "
                f"(this code reads format {layout.FORMAT_VERSION})"
            )
        return cls(root, layout.StoreConfig(**marker["config"]), clock, context)

    def tenants(self) -> list[str]:
        """Tenants that have a partition."""
        spec = layout.child_spec(self.root, "partitions")
        markers = ts.KvStore.open(spec, context=self.context).result()
        return sorted(k.decode() for k in markers.list().result())

    def partition_spec(self, tenant: str) -> dict:
        check_tenant_id(tenant)
        return layout.child_spec(self.root, "tenants", tenant)

    def writer(self, tenant: str, *, redactor: Redactor | None = None) -> PartitionWriter:
        """The (single) writer of `tenant`'s partition, created on first use."""
        spec = self.partition_spec(tenant)
        self._kvstore.write(f"partitions/{tenant}", b"").result()
        return PartitionWriter(
            spec, tenant, self.config, redactor=redactor, clock=self.clock, context=self.context
        )

    def reader(self, tenant: str, *, principal: str, purpose: str = "training") -> PartitionReader:
        """A reader of `tenant`'s partition for `principal`.

        Raises `AccessDenied` unless `principal` is the tenant, holds an active grant for
        `purpose`, or is an operator running maintenance (a reader without content access).
        Cross-tenant and operator access is recorded in the tenant's audit log.
        """
        content = not (purpose in ("inspect", "purge") and principal != tenant)
        self.access.check(tenant, principal, purpose, content=content)
        spec = self.partition_spec(tenant)
        return PartitionReader(spec, tenant, self.config, content=content, context=self.context)

    def purge_expired(
        self, tenant: str, *, principal: str, now: float | None = None, dry_run: bool = False
    ) -> list[str]:
        """Retention: purges `tenant`'s expired trajectories; returns their ids (audited).

        What was derived from them goes too (`lineage.purge_cascade`): ids derived inside
        `tenant` are in the returned list, those derived into other partitions are purged
        there and recorded in those partitions' audit logs. Run by the tenant itself or an
        operator; needs the writer lock of every partition touched, so a live writer should
        call `PartitionWriter.purge_expired` itself instead.
        """
        self.access.check(tenant, principal, "purge", content=False)
        now = self.clock() if now is None else now
        if dry_run:
            spec = self.partition_spec(tenant)
            reader = PartitionReader(spec, tenant, self.config, content=False, context=self.context)
            reader.refresh()
            expired = [
                e.trajectory_id
                for e in reader.entries(closed_only=False)
                if is_expired(e.governance(), now)
            ]
            return lineage.purge_plan(self, tenant, expired)[-1][1]
        with self.writer(tenant) as writer:
            purged = lineage.purge_cascade(
                self, writer, writer.expired_ids(now), reason="retention expired"
            )
        for other, ids in purged.items():
            detail = {"purged": len(ids), "now": now}
            if other != tenant:
                detail["derived_from_tenant"] = tenant
            self.access.audit(
                other,
                principal=principal,
                action="purge",
                purpose="retention" if other == tenant else "lineage",
                allowed=True,
                detail=detail,
            )
        return purged[tenant]

    def grant(self, tenant: str, grantee: str, **kwargs) -> Grant:
        """See `AccessControl.grant`."""
        return self.access.grant(tenant, grantee, **kwargs)

    def revoke(self, tenant: str, grant_id: str, *, revoked_by: str) -> Grant:
        return self.access.revoke(tenant, grant_id, revoked_by=revoked_by)

    def audit_log(self, tenant: str) -> list[dict]:
        return self.access.audit_log(tenant)


__all__ = ["AccessDenied", "AtdpStore"]
