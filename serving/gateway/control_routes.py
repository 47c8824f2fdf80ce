"""Admin routes of the composite policies (serving/control), on the gateway.

    GET  /rl/control/{tenant}                      the current composite (version 0: empty)
    GET  /rl/control/{tenant}/history              every stored version, oldest first
    GET  /rl/control/{tenant}/versions/{version}   one version
    GET  /rl/control/{tenant}/diff?from=A&to=B     what changed from version A to B
    PUT  /rl/control/{tenant}  {"composite": {parts}, "reason"?, "expected_version"?}
    POST /rl/control/{tenant}/rollback  {"version", "reason"?}
    GET  /rl/control/{tenant}/canary               the running canary ({"canary": null}: none)
    PUT  /rl/control/{tenant}/canary  {"share", "version"?, "baseline"?, "salt"?, "reason"?}
    POST /rl/control/{tenant}/canary/stop  {"keep": true | false, "reason"?}

All need the admin key. The writes are audited in the gateway's audit log
(`<state_dir>/audit.jsonl`), refused ones included, with the version they made. A malformed
composite is a 400 naming the field, an unknown version a 404, a put whose expected_version is
no longer current a 409, a canary that conflicts (one already running, none to stop, a version
that is not the newest) a 409; none of them changes the history. The next completion of the
tenant uses the new version. A canary serves the tenant's newest version to `share` of its
sessions (a hash of the session id) and `baseline` (default: the newest's parent) to the
others; stopping it with `keep` false rolls back to the baseline (serving/control/canary.py).
"""

from __future__ import annotations

import asyncio
from typing import Any

from aiohttp import web

from serving.common.errors import ApiError, bad_request, read_json_object
from serving.control.canary import CanaryError
from serving.control.composite import CompositeError
from serving.control.deploy import finish_canary
from serving.control.store import (
    CompositeStore,
    ControlError,
    InvalidTenant,
    UnknownVersion,
    VersionConflict,
)

PREFIX = "/rl/control/{tenant}"


def _api_error(error: Exception) -> ApiError:
    if isinstance(error, CompositeError):
        return ApiError(
            400, f"invalid composite: {error}", param="composite", code="invalid_composite"
        )
    if isinstance(error, UnknownVersion):
        return ApiError(404, str(error), param="version", code="version_not_found")
    if isinstance(error, VersionConflict):
        return ApiError(409, str(error), param="expected_version", code="version_conflict")
    if isinstance(error, InvalidTenant):
        return ApiError(400, str(error), param="tenant")
    if isinstance(error, CanaryError):
        return ApiError(409, str(error), code="canary_conflict")
    raise error


def _caller(principal) -> str:
    """How a caller appears in the audit log (as on the data-rights routes)."""
    if principal.kind == "session":
        return f"session:{principal.session.session_id}"
    return "admin" if principal.is_admin else principal.tenant.name


def _version(value: Any, name: str) -> int:
    if isinstance(value, str) and value.isdigit():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise bad_request(f"'{name}' must be a version number (an integer >= 0)", param=name)
    return value


def add_control_routes(app: web.Application, gateway_key, audit_key, principal) -> None:
    """Adds the routes to `app`; `principal(request)` authenticates (gateway/app.py)."""

    def store_for(request: web.Request) -> tuple[CompositeStore, str]:
        caller = principal(request)
        if not caller.is_admin:
            raise ApiError(403, "the composite policy routes need the admin key", code="admin_only")
        gateway = request.app[gateway_key]
        tenant = request.match_info["tenant"]
        gateway.tenants.tenant(tenant)  # 404 unknown tenant (400 invalid name in open mode)
        return gateway.composites, tenant

    async def run(fn, *args, **kwargs):
        try:
            return await asyncio.to_thread(fn, *args, **kwargs)
        except (ControlError, CompositeError) as error:
            raise _api_error(error) from None

    async def current(request: web.Request) -> web.Response:
        store, tenant = store_for(request)
        return web.json_response((await run(store.current, tenant)).to_json())

    async def history(request: web.Request) -> web.Response:
        store, tenant = store_for(request)
        versions = await run(store.history, tenant)
        return web.json_response({"tenant": tenant, "versions": [v.to_json() for v in versions]})

    async def version(request: web.Request) -> web.Response:
        store, tenant = store_for(request)
        number = _version(request.match_info["version"], "version")
        return web.json_response((await run(store.get, tenant, number)).to_json())

    async def diff(request: web.Request) -> web.Response:
        store, tenant = store_for(request)
        old = _version(request.query.get("from"), "from")
        new = _version(request.query.get("to"), "to")
        return web.json_response(await run(store.diff, tenant, old, new))

    async def audited(request: web.Request, operation: str, write) -> web.Response:
        entry: dict[str, Any] = {
            "route": request.path,
            "operation": operation,
            "principal": "unauthenticated",
            "tenant": request.match_info["tenant"],
        }
        audit = request.app[audit_key]
        try:
            caller = principal(request)
            entry["principal"] = _caller(caller)
            store, tenant = store_for(request)
            body = await read_json_object(request)
            reason = body.get("reason", "")
            if not isinstance(reason, str):
                raise bad_request("'reason' must be a string", param="reason")
            entry["reason"] = reason
            made = await write(store, tenant, body, reason)
        except Exception as error:
            status = getattr(error, "status", 500)
            await asyncio.to_thread(audit.record, **entry, status=status, error=str(error))
            raise
        await asyncio.to_thread(audit.record, **entry, status=200, version=made.version)
        return web.json_response(made.to_json())

    async def put(request: web.Request) -> web.Response:
        async def write(store: CompositeStore, tenant: str, body: dict, reason: str):
            if "composite" not in body:
                raise bad_request(
                    "'composite' (an object of the parts policy, harness, memory, tools, "
                    "governance) is required",
                    param="composite",
                )
            expected = body.get("expected_version")
            if expected is not None:
                expected = _version(expected, "expected_version")
            return await run(
                store.put, tenant, body["composite"], reason=reason, expected_version=expected
            )

        return await audited(request, "put", write)

    async def rollback(request: web.Request) -> web.Response:
        async def write(store: CompositeStore, tenant: str, body: dict, reason: str):
            target = _version(body.get("version"), "version")
            return await run(store.rollback, tenant, target, reason=reason)

        return await audited(request, "rollback", write)

    async def canary(request: web.Request) -> web.Response:
        store_for(request)
        tenant = request.match_info["tenant"]
        running = await run(request.app[gateway_key].canaries.get, tenant)
        return web.json_response({"canary": None if running is None else running.to_json()})

    async def start_canary(request: web.Request) -> web.Response:
        async def write(store: CompositeStore, tenant: str, body: dict, reason: str):
            share = body.get("share")
            if isinstance(share, bool) or not isinstance(share, int | float) or not 0 < share < 1:
                raise bad_request("'share' must be a number in (0, 1)", param="share")
            optional = {}
            for name in ("version", "baseline"):
                if body.get(name) is not None:
                    optional[name] = _version(body[name], name)
            salt = body.get("salt")
            if salt is not None and (not isinstance(salt, str) or not salt):
                raise bad_request("'salt' must be a non-empty string", param="salt")
            book = request.app[gateway_key].canaries
            return await run(book.start, tenant, share=float(share), salt=salt, **optional)

        return await audited(request, "canary_start", write)

    async def stop_canary(request: web.Request) -> web.Response:
        async def write(store: CompositeStore, tenant: str, body: dict, reason: str):
            keep = body.get("keep", True)
            if not isinstance(keep, bool):
                raise bad_request("'keep' must be true or false", param="keep")
            book = request.app[gateway_key].canaries
            return await run(finish_canary, store, book, tenant, keep=keep, reason=reason)

        return await audited(request, "canary_stop", write)

    app.router.add_get(PREFIX, current)
    app.router.add_put(PREFIX, put)
    app.router.add_get(PREFIX + "/history", history)
    app.router.add_get(PREFIX + "/versions/{version}", version)
    app.router.add_get(PREFIX + "/diff", diff)
    app.router.add_post(PREFIX + "/rollback", rollback)
    app.router.add_get(PREFIX + "/canary", canary)
    app.router.add_put(PREFIX + "/canary", start_canary)
    app.router.add_post(PREFIX + "/canary/stop", stop_canary)
