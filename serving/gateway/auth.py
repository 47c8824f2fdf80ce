"""Who is calling: the admin, a tenant (its API key) or one session (its session key).

Keys are compared as sha256 digests (`hmac.compare_digest` for the admin key). What each
principal may do:

| principal | chat / completions | start_session | set_reward, end_session | export | pause, update |
|---|---|---|---|---|---|
| admin | no | any tenant | any session | any tenant | yes |
| tenant | one-call trajectories | its own tenant | its tenant's sessions | its own tenant | no |
| session | in its session | no | its own session | no | no |

A key asking for a session it does not own gets the same 404 as a session that does not exist,
so keys cannot probe other tenants' session ids.
"""

from __future__ import annotations

import dataclasses
import hmac

from aiohttp import web

from serving.common.errors import ApiError
from serving.common.http import bearer_token, key_digest
from serving.gateway.sessions import SessionRecord, SessionTable
from serving.gateway.tenants import Tenant, TenantDirectory


@dataclasses.dataclass(frozen=True)
class Principal:
    kind: str  # "admin" | "tenant" | "session"
    tenant: Tenant | None = None
    session: SessionRecord | None = None

    @property
    def is_admin(self) -> bool:
        return self.kind == "admin"


def authenticate(
    request: web.Request, admin_key: str, tenants: TenantDirectory, sessions: SessionTable
) -> Principal:
    """The caller of `request`, or a 401 naming what is wrong with its key."""
    key = bearer_token(request)
    if key is None:
        raise ApiError(
            401,
            "missing API key: send 'Authorization: Bearer <key>' (a session key from "
            "/rl/start_session, a tenant key, or the admin key)",
            code="invalid_api_key",
        )
    if hmac.compare_digest(key_digest(key), key_digest(admin_key)):
        return Principal("admin")
    session = sessions.by_key(key)
    if session is not None:
        return Principal("session", tenants.tenant(session.tenant), session)
    tenant = tenants.tenant_for_key(key)
    if tenant is not None:
        return Principal("tenant", tenant)
    raise ApiError(401, "invalid API key", code="invalid_api_key")


def require_admin(principal: Principal) -> None:
    if not principal.is_admin:
        raise ApiError(403, "this endpoint needs the admin key", code="admin_only")


def session_not_found(session_id: str) -> ApiError:
    return ApiError(
        404,
        f"no session {session_id!r} for this API key",
        param="session_id",
        code="session_not_found",
    )


def owned_session(
    principal: Principal, sessions: SessionTable, session_id: str | None
) -> SessionRecord:
    """The session `principal` may act on: its own (session key), one of its tenant's (tenant
    key) or any (admin). `session_id` None means the session key's own session."""
    if principal.kind == "session":
        if session_id is not None and session_id != principal.session.session_id:
            raise session_not_found(session_id)
        return principal.session
    if session_id is None:
        raise ApiError(
            400, "'session_id' is required with a tenant or admin key", param="session_id"
        )
    record = sessions.get(session_id)
    if record is None or (principal.kind == "tenant" and record.tenant != principal.tenant.name):
        raise session_not_found(session_id)
    return record
