"""Deletion and consent-withdrawal requests: their body, and whose data a key may touch.

    POST /rl/delete           {"tenant"?, one of "session_id" / "user_id" / "trajectory_ids",
                               "reason"?}
    POST /rl/withdraw_consent {"tenant"?, one of "session_id" / "user_id" / "trajectory_ids"}

Scope: the admin key acts on any tenant (named by "tenant", or implied by a session of the
gateway's table); a tenant key only on its own tenant (naming another is a 403); a session key
on nothing (403). The body is checked whole before anything is touched: unknown fields, no or
several selectors, or ill-typed values are a 400 and change nothing. A null field counts as
absent.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from serving.common.errors import ApiError, bad_request
from serving.gateway.auth import Principal, session_not_found
from serving.gateway.sessions import SessionTable
from serving.gateway.tenants import TenantDirectory

ADMIN_PRINCIPAL = "operator:gateway-admin"  # how the admin key appears in a tenant's audit log
DEFAULT_REASON = "deletion request"
SELECTORS = ("session_id", "user_id", "trajectory_ids")
MAX_IDS = 10_000  # one request; more is a batch job, not an HTTP call
MAX_ID_CHARS = 256
MAX_REASON_CHARS = 500


@dataclasses.dataclass(frozen=True)
class DataRequest:
    """A checked request: the tenant it acts on, who asks, and which trajectories."""

    tenant: str
    requested_by: str
    selector: dict[str, Any]  # exactly one of SELECTORS
    reason: str = DEFAULT_REASON


def _identifier(body: dict, name: str) -> str | None:
    value = body.get(name)
    if value is None:
        return None
    if not isinstance(value, str) or not value or len(value) > MAX_ID_CHARS:
        raise bad_request(f"'{name}' must be a non-empty string of <= {MAX_ID_CHARS}", param=name)
    return value


def _trajectory_ids(body: dict) -> list[str] | None:
    value = body.get("trajectory_ids")
    if value is None:
        return None
    if (
        not isinstance(value, list)
        or not 1 <= len(value) <= MAX_IDS
        or not all(isinstance(i, str) and 0 < len(i) <= MAX_ID_CHARS for i in value)
    ):
        raise bad_request(
            f"'trajectory_ids' must be a list of 1 to {MAX_IDS} non-empty strings",
            param="trajectory_ids",
        )
    return list(dict.fromkeys(value))


def _reason(body: dict) -> str:
    value = body.get("reason")
    if value is None:  # null is absent, as for every optional field
        return DEFAULT_REASON
    if not isinstance(value, str) or not value.strip() or len(value) > MAX_REASON_CHARS:
        raise bad_request(
            f"'reason' must be a non-empty string of <= {MAX_REASON_CHARS} characters",
            param="reason",
        )
    return value


def parse_data_request(
    principal: Principal,
    body: dict[str, Any],
    *,
    tenants: TenantDirectory,
    sessions: SessionTable,
    with_reason: bool,
) -> DataRequest:
    """The request `principal` made with `body`, or the 4xx that says what is wrong."""
    allowed = {"tenant", *SELECTORS} | ({"reason"} if with_reason else set())
    unknown = sorted(set(body) - allowed)
    if unknown:
        raise bad_request(f"unknown fields {unknown}; expected some of {sorted(allowed)}")
    selector = {
        "session_id": _identifier(body, "session_id"),
        "user_id": _identifier(body, "user_id"),
        "trajectory_ids": _trajectory_ids(body),
    }
    selector = {k: v for k, v in selector.items() if v is not None}
    if len(selector) != 1:
        raise bad_request(
            "give exactly one of 'session_id', 'user_id' or 'trajectory_ids' "
            f"(got {sorted(selector) or 'none'})"
        )
    reason = _reason(body) if with_reason else DEFAULT_REASON
    tenant = body.get("tenant")
    if tenant is not None and not isinstance(tenant, str):
        raise bad_request("'tenant' must be a string", param="tenant")
    record = sessions.get(selector["session_id"]) if "session_id" in selector else None
    if principal.kind == "session":
        raise ApiError(
            403,
            "a session key cannot delete data or withdraw consent; use the tenant or admin key",
            code="forbidden",
        )
    if principal.kind == "tenant":
        own = principal.tenant.name
        if tenant is not None and tenant != own:
            raise ApiError(
                403,
                "a tenant key can only act on its own tenant's data",
                param="tenant",
                code="forbidden",
            )
        tenant, requested_by = own, own
    else:
        requested_by = ADMIN_PRINCIPAL
        if tenant is None:
            if record is None:
                raise bad_request(
                    "'tenant' is required with the admin key (unless 'session_id' names a "
                    "session of this gateway)",
                    param="tenant",
                )
            tenant = record.tenant
        tenants.tenant(tenant)  # 404 for an unknown tenant, 400 for an invalid name
    if record is not None and record.tenant != tenant:
        raise session_not_found(selector["session_id"])  # no probing other tenants' sessions
    return DataRequest(tenant, requested_by, selector, reason)
