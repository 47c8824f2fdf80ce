"""`AtdpStore`: the entry point to an ATDP buffer on any TensorStore kvstore.

```python
store = AtdpStore.open("/data/atdp")              # or "gs://bucket/atdp", or a kvstore spec
with store.writer("acme") as writer:              # one writer per tenant partition
    writer.append([trajectory])                   # durable on return
reader = store.reader("acme", principal="acme")   # another principal needs a grant
reader.refresh()
trajectory = reader.read(reader.trajectory_ids()[0])
```

Store-level changes of a partition (retention purges, deletions, consent withdrawals) go
through the partition's live writer when this process has one open (`writer()` remembers it),
else through a short-lived writer of their own; another process's live writer makes them raise
`PartitionLockedError` on local files.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import tensorstore as ts

from atdp_io import deletion, layout, lineage
from atdp_io.access import AccessControl, AccessDenied, Grant, is_operator
from atdp_io.governance import EligibilityPolicy, is_expired
from atdp_io.reader import PartitionReader
from atdp_io.redaction import Redactor
from atdp_io.schema import ConsentStatus, GovernanceUpdate, check_tenant_id
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
        # This process's live writers, so maintenance reuses them rather than fight their lock;
        # the per-tenant lock keeps a maintenance writer and `writer()` from racing for it.
        self._live: weakref.WeakValueDictionary[str, PartitionWriter] = (
            weakref.WeakValueDictionary()
        )
        self._tenant_locks: dict[str, threading.RLock] = {}
        self._locks_lock = threading.Lock()

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
        with self._tenant_lock(tenant):
            self._kvstore.write(f"partitions/{tenant}", b"").result()
            writer = PartitionWriter(
                spec, tenant, self.config, redactor=redactor, clock=self.clock, context=self.context
            )
            self._live[tenant] = writer
        return writer

    def reader(
        self,
        tenant: str,
        *,
        principal: str,
        purpose: str = "training",
        eligibility: EligibilityPolicy | None = None,
        reason: str = "",
    ) -> PartitionReader:
        """A reader of `tenant`'s partition for `principal` and `purpose`.

        Raises `AccessDenied` unless `principal` is the tenant, holds an active grant for
        `purpose`, or is an operator running maintenance (a reader without content access) or
        an `operator_review` (content, ineligible data included; needs `reason`). Cross-tenant
        and operator access is recorded in the tenant's audit log. The reader refuses what
        `purpose` may not serve (see reader.py); `eligibility` is a training reader's policy.
        """
        content = not (purpose in ("inspect", "purge") and principal != tenant)
        self.access.check(tenant, principal, purpose, content=content, reason=reason)
        spec = self.partition_spec(tenant)

        def audit(action: str, detail: dict) -> None:
            detail = {**detail, "reason": reason}
            self.access.audit(
                tenant, principal=principal, action=action, purpose=purpose, allowed=True,
                detail=detail,
            )  # fmt: skip

        return PartitionReader(
            spec,
            tenant,
            self.config,
            content=content,
            context=self.context,
            purpose=purpose,
            policy=eligibility,
            clock=self.clock,
            audit=audit,
        )

    def purge_expired(
        self, tenant: str, *, principal: str, now: float | None = None, dry_run: bool = False
    ) -> list[str]:
        """Retention: purges `tenant`'s expired trajectories; returns their ids (audited).

        What was derived from them goes too (`lineage.purge_cascade`): ids derived inside
        `tenant` are in the returned list, those derived into other partitions are purged
        there and recorded in those partitions' audit logs. Run by the tenant itself or an
        operator. Opens a writer only when something expired: this process's live writer of a
        partition if it has one, else its own (which fails with `PartitionLockedError` while
        another process writes that partition). `atdp_io.retention.PurgeSchedule` runs this
        periodically.
        """
        self.access.check(tenant, principal, "purge", content=False)
        now = self.clock() if now is None else now
        expired = [
            e.trajectory_id
            for e in self._index_reader(tenant).entries(closed_only=False)
            if is_expired(e.governance(), now)
        ]
        if dry_run:
            return lineage.purge_plan(self, tenant, expired)[-1][1]
        purged = {tenant: []}
        if expired:  # no writer otherwise: on remote kvstores a writer's takeover fences others
            purged = self._purge_cascade(tenant, expired, reason="retention expired")
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

    def _purge_cascade(self, tenant: str, ids: Sequence[str], *, reason: str) -> dict:
        """`lineage.purge_cascade` through this process's live writers where it has them."""
        return lineage.purge_cascade(
            self, tenant, ids, reason=reason, open_writer=self._maintenance_writer
        )

    def delete_trajectories(
        self,
        tenant: str,
        *,
        requested_by: str,
        session_id: str | None = None,
        user_id: str | None = None,
        trajectory_ids: Sequence[str] | None = None,
        reason: str,
    ) -> list[str]:
        """Erases the selected trajectories' bytes (as a purge does), and those of every record
        derived from them (`lineage`; in other partitions too, audited there); returns the ids
        erased in `tenant`.

        Selectors combine with AND (see deletion.py; `user_id` matches `header.task["user_id"]`).
        `requested_by` must be the tenant itself or an operator. Audited, as is a refusal. A
        bad request raises (`ValueError`, `AccessDenied`, `deletion.UnknownTenantError`) before
        anything changes; listed ids that are not (or no longer) stored match nothing.
        """
        selection = deletion.check_request(
            "delete_trajectories",
            requested_by=requested_by,
            session_id=session_id,
            user_id=user_id,
            trajectory_ids=trajectory_ids,
        )
        if not isinstance(reason, str) or not reason.strip():
            raise ValueError(f"delete_trajectories: give a non-empty reason, got {reason!r}")
        self._check_steward(tenant, requested_by, "delete", selection)
        # Selected before any writer opens: a request that fails or matches nothing writes
        # nothing (a writer's takeover alone rewrites the head).
        chosen = deletion.select(self._index(tenant), selection, tenant)
        purged = {tenant: []}
        if chosen:  # and what was derived from them, in any partition (lineage)
            purged = self._purge_cascade(tenant, chosen, reason=f"deletion request: {reason}")
        deleted = purged[tenant]
        detail = {**selection.as_detail(), "reason": reason, "deleted": deleted}
        self.access.audit(
            tenant,
            principal=requested_by,
            action="delete",
            purpose="deletion",
            allowed=True,
            detail=detail,
        )
        for other, ids in purged.items():
            if other != tenant:
                self.access.audit(
                    other, principal=requested_by, action="delete", purpose="lineage",
                    allowed=True, detail={"deleted": ids, "derived_from_tenant": tenant},
                )  # fmt: skip
        return deleted

    def withdraw_consent(
        self,
        tenant: str,
        *,
        requested_by: str,
        session_id: str | None = None,
        user_id: str | None = None,
        trajectory_ids: Sequence[str] | None = None,
    ) -> list[str]:
        """Withdraws consent for the selected trajectories; returns their ids.

        Each gets a `GovernanceUpdate(consent=WITHDRAWN)` annotation (none when already
        withdrawn), so the loader, training readers and exports stop serving it on their next
        refresh; the bytes stay until deleted or expired. Records derived from them (`lineage`,
        any partition) are withdrawn too, audited in their partitions. Selection, permission,
        errors and audit as for `delete_trajectories`; returns the selected ids of `tenant`.
        """
        selection = deletion.check_request(
            "withdraw_consent",
            requested_by=requested_by,
            session_id=session_id,
            user_id=user_id,
            trajectory_ids=trajectory_ids,
        )
        self._check_steward(tenant, requested_by, "withdraw_consent", selection)
        now = self.clock()
        index = self._index(tenant)
        chosen = deletion.select(index, selection, tenant)
        # records derived from them carry their consent (lineage): withdrawn there too; every
        # partition's index is read once, for the descendants and for their current consent
        indices = {tenant: index}
        if chosen:  # nothing selected: no other partition is read
            indices = {t: index if t == tenant else self._index(t) for t in self.tenants()}
        derived: dict[str, list[str]] = {}
        for ref in lineage.descendants(indices, tenant, chosen) if chosen else ():
            derived.setdefault(ref.tenant, []).append(ref.trajectory_id)
        targets = {tenant: chosen}
        for other, ids in derived.items():
            targets[other] = [*targets.get(other, []), *ids]
        annotated = 0
        for other in sorted(targets, key=lambda t: t == tenant):  # the sources' partition last
            other_index = indices[other]
            updates = [
                GovernanceUpdate(
                    trajectory_id,
                    timestamp=now,
                    reason=f"consent withdrawn (requested by {requested_by})"
                    + ("" if other == tenant else f", derived from {tenant!r}"),
                    consent=ConsentStatus.WITHDRAWN,
                )
                for trajectory_id in sorted(set(targets[other]))
                if other_index.by_id[trajectory_id].governance().consent != ConsentStatus.WITHDRAWN
            ]
            if updates:
                with self._maintenance_writer(other) as writer:
                    writer.annotate(*updates)
                annotated += len(updates)
            if other != tenant:
                self.access.audit(
                    other, principal=requested_by, action="withdraw_consent", purpose="lineage",
                    allowed=True, detail={"withdrawn": targets[other], "derived_from_tenant": tenant},
                )  # fmt: skip
        detail = {**selection.as_detail(), "withdrawn": chosen, "annotated": annotated}
        self.access.audit(
            tenant,
            principal=requested_by,
            action="withdraw_consent",
            purpose="consent",
            allowed=True,
            detail=detail,
        )
        return chosen

    def grant(self, tenant: str, grantee: str, **kwargs) -> Grant:
        """See `AccessControl.grant`."""
        return self.access.grant(tenant, grantee, **kwargs)

    def revoke(self, tenant: str, grant_id: str, *, revoked_by: str) -> Grant:
        return self.access.revoke(tenant, grant_id, revoked_by=revoked_by)

    def audit_log(self, tenant: str) -> list[dict]:
        return self.access.audit_log(tenant)

    def _check_steward(
        self, tenant: str, principal: str, action: str, selection: deletion.Selection
    ) -> None:
        """Only the tenant itself or an operator changes a partition's data (refusals audited)."""
        check_tenant_id(tenant)
        if tenant not in self.tenants():
            raise deletion.UnknownTenantError(f"{action}: the store has no tenant {tenant!r}")
        if principal != tenant and not is_operator(principal):
            self.access.audit(
                tenant, principal=principal, action=action, purpose=action, allowed=False,
                detail=selection.as_detail(),
            )  # fmt: skip
            raise AccessDenied(f"{action}: {principal!r} may not change the data of {tenant!r}")

    def _index_reader(self, tenant: str) -> PartitionReader:
        """A maintenance reader of the partition (headers only, no content), refreshed."""
        spec = self.partition_spec(tenant)
        reader = PartitionReader(spec, tenant, self.config, content=False, context=self.context)
        reader.refresh()
        return reader

    def _index(self, tenant: str):
        """The partition's committed index, read fresh (headers only, no content)."""
        return self._index_reader(tenant).index

    def _tenant_lock(self, tenant: str) -> threading.RLock:
        with self._locks_lock:
            return self._tenant_locks.setdefault(tenant, threading.RLock())

    @contextlib.contextmanager
    def _maintenance_writer(self, tenant: str) -> Iterator[PartitionWriter]:
        """This process's live writer of `tenant`, else a writer for the duration."""
        with self._tenant_lock(tenant):
            live = self._live.get(tenant)
            # `_closed` is the writer's own flag; a closed writer has released its lock.
            if live is not None and not live._closed:
                yield live
                return
            with self.writer(tenant) as writer:
                yield writer


__all__ = ["AccessDenied", "AtdpStore"]
