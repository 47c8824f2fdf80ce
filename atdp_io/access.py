"""Tenant isolation: explicit grants and an append-only audit log per partition.

A principal may read its own tenant's partition. Reading another tenant's partition needs an
active `Grant` from that tenant naming the principal and the purpose; every cross-tenant attempt
(allowed or denied), every grant and every revocation is written to the owner's audit log.
Operator principals (`operator:<name>`; tenant ids cannot contain ':') may run maintenance
(`inspect` counts, `purge`) on any partition without content access; those runs are audited too.
The one way an operator reads content, ineligible data included, is the `operator_review`
purpose: it needs a stated reason, and the opening and every read of a trajectory a training
reader would refuse are audited.

Principals are strings the caller has already authenticated (the gateway's job); this module
decides and records what each may read.
"""

from __future__ import annotations

import dataclasses
import json
import time
import uuid
from collections.abc import Callable, Mapping
from typing import Any

import tensorstore as ts

from atdp_io import layout
from atdp_io.schema import check_tenant_id

OPERATOR_PREFIX = "operator:"
MAINTENANCE_PURPOSES = frozenset({"inspect", "purge"})
OPERATOR_REVIEW = "operator_review"  # same string as governance.OPERATOR_REVIEW


class AccessDenied(PermissionError):
    """The principal has no right to this partition for this purpose."""


@dataclasses.dataclass(frozen=True)
class Grant:
    """Tenant `tenant` lets `grantee` read its partition for `purpose` until `expires_at`."""

    grant_id: str
    tenant: str
    grantee: str
    purpose: str
    granted_by: str
    granted_at: float
    expires_at: float | None = None
    revoked_at: float | None = None
    revoked_by: str = ""

    def active(self, now: float) -> bool:
        return self.revoked_at is None and (self.expires_at is None or now < self.expires_at)


def is_operator(principal: str) -> bool:
    return principal.startswith(OPERATOR_PREFIX) and len(principal) > len(OPERATOR_PREFIX)


class AccessControl:
    """Grants and audit entries stored as one key each under a tenant's partition."""

    def __init__(
        self,
        root: Mapping[str, Any],
        clock: Callable[[], float] = time.time,
        context: ts.Context | None = None,
    ):
        self._root = dict(root)
        self._clock = clock
        self._context = context or ts.Context()

    def grant(
        self,
        tenant: str,
        grantee: str,
        *,
        granted_by: str,
        purpose: str,
        expires_at: float | None = None,
    ) -> Grant:
        """Records a grant; `granted_by` must be the tenant itself or an operator."""
        check_tenant_id(tenant)
        _check_principal(grantee, "grantee")
        if grantee == tenant:
            raise ValueError("grant: a tenant needs no grant for its own partition")
        if granted_by != tenant and not is_operator(granted_by):
            raise AccessDenied(f"grant: {granted_by!r} may not grant access to {tenant!r}")
        if not purpose:
            raise ValueError("grant: purpose must not be empty")
        grant = Grant(
            grant_id=uuid.uuid4().hex,
            tenant=tenant,
            grantee=grantee,
            purpose=purpose,
            granted_by=granted_by,
            granted_at=self._clock(),
            expires_at=expires_at,
        )
        self._put(tenant, f"grants/{grant.grant_id}.json", dataclasses.asdict(grant))
        self.audit(
            tenant,
            principal=granted_by,
            action="grant",
            purpose=purpose,
            allowed=True,
            grant_id=grant.grant_id,
            detail={"grantee": grantee},
        )
        return grant

    def revoke(self, tenant: str, grant_id: str, *, revoked_by: str) -> Grant:
        grants = {g.grant_id: g for g in self.grants(tenant)}
        if grant_id not in grants:
            raise KeyError(f"revoke: no grant {grant_id!r} on tenant {tenant!r}")
        if revoked_by != tenant and not is_operator(revoked_by):
            raise AccessDenied(f"revoke: {revoked_by!r} may not revoke grants of {tenant!r}")
        revoked = dataclasses.replace(
            grants[grant_id], revoked_at=self._clock(), revoked_by=revoked_by
        )
        # A separate key: the grant record itself is never rewritten.
        self._put(tenant, f"grants/{grant_id}.revoked.json", dataclasses.asdict(revoked))
        self.audit(
            tenant,
            principal=revoked_by,
            action="revoke",
            purpose=revoked.purpose,
            allowed=True,
            grant_id=grant_id,
        )
        return revoked

    def grants(self, tenant: str) -> list[Grant]:
        """Every grant of a tenant, revocations applied, oldest first."""
        by_id: dict[str, Grant] = {}
        revocations = []
        for key, value in self._items(tenant, "grants/"):
            grant = Grant(**value)
            if key.endswith(".revoked.json"):
                revocations.append(grant)
            else:
                by_id[grant.grant_id] = grant
        for revoked in revocations:
            by_id[revoked.grant_id] = revoked
        return sorted(by_id.values(), key=lambda g: g.granted_at)

    def check(
        self, tenant: str, principal: str, purpose: str, *, content: bool, reason: str = ""
    ) -> None:
        """Raises `AccessDenied` unless `principal` may read `tenant` for `purpose` (audited).

        `reason`: why an operator opens an `operator_review` reader (required there).
        """
        check_tenant_id(tenant)
        _check_principal(principal, "principal")
        if purpose == OPERATOR_REVIEW:
            self._check_review(tenant, principal, reason)
            return
        if principal == tenant:
            return
        if is_operator(principal) and purpose in MAINTENANCE_PURPOSES and not content:
            self.audit(
                tenant, principal=principal, action="maintenance", purpose=purpose, allowed=True
            )
            return
        now = self._clock()
        for grant in self.grants(tenant):
            if grant.grantee == principal and grant.purpose == purpose and grant.active(now):
                self.audit(
                    tenant,
                    principal=principal,
                    action="read",
                    purpose=purpose,
                    allowed=True,
                    grant_id=grant.grant_id,
                )
                return
        self.audit(tenant, principal=principal, action="read", purpose=purpose, allowed=False)
        raise AccessDenied(
            f"{principal!r} has no active grant to read tenant {tenant!r} for {purpose!r}"
        )

    def _check_review(self, tenant: str, principal: str, reason: str) -> None:
        if not isinstance(reason, str) or not reason.strip():
            raise ValueError(f"{OPERATOR_REVIEW}: give a non-empty reason, got {reason!r}")
        allowed = is_operator(principal)
        self.audit(
            tenant,
            principal=principal,
            action=OPERATOR_REVIEW,
            purpose=OPERATOR_REVIEW,
            allowed=allowed,
            detail={"reason": reason},
        )
        if not allowed:
            raise AccessDenied(
                f"{principal!r} may not open an {OPERATOR_REVIEW!r} reader (operators only)"
            )

    def audit(
        self,
        tenant: str,
        *,
        principal: str,
        action: str,
        purpose: str,
        allowed: bool,
        grant_id: str = "",
        detail: Mapping[str, Any] | None = None,
    ) -> None:
        now = self._clock()
        entry = {
            "time": now,
            "tenant": tenant,
            "principal": principal,
            "action": action,
            "purpose": purpose,
            "allowed": allowed,
            "grant_id": grant_id,
            "detail": dict(detail or {}),
        }
        key = f"audit/{time.time_ns():020d}-{uuid.uuid4().hex[:8]}.json"
        self._put(tenant, key, entry)

    def audit_log(self, tenant: str) -> list[dict]:
        """Every audit entry of a tenant, oldest first."""
        return [value for _, value in sorted(self._items(tenant, "audit/"))]

    def _kvstore(self, tenant: str) -> ts.KvStore:
        spec = layout.child_spec(self._root, "tenants", tenant)
        return ts.KvStore.open(spec, context=self._context).result()

    def _put(self, tenant: str, key: str, value: Mapping[str, Any]) -> None:
        raw = json.dumps(value, sort_keys=True).encode()
        stamp = self._kvstore(tenant).write(key, raw, if_equal=layout.MISSING_GENERATION).result()
        if not stamp.generation:
            raise RuntimeError(f"audit/grant key {key!r} already exists (clock or id collision)")

    def _items(self, tenant: str, prefix: str) -> list[tuple[str, dict]]:
        spec = layout.child_spec(self._root, "tenants", tenant, prefix)
        kvstore = ts.KvStore.open(spec, context=self._context).result()
        keys = sorted(k.decode() for k in kvstore.list().result())
        futures = [kvstore.read(k) for k in keys]
        return [(k, json.loads(f.result().value)) for k, f in zip(keys, futures, strict=True)]


def _check_principal(principal: Any, what: str) -> None:
    if not isinstance(principal, str) or not principal:
        raise ValueError(f"{what} must be a non-empty string, got {principal!r}")
    if not is_operator(principal):
        check_tenant_id(principal, what)
