"""The public HTTP API: OpenAI-compatible completions plus the RL session endpoints.

    POST /v1/chat/completions, /v1/completions     session key or tenant key
    POST /v1/responses, GET /v1/responses/{id}      session key or tenant key (Responses API)
    GET  /v1/models, /v1/models/{id}               any valid key
    POST /rl/start_session  {"tenant"?, "task_id"?, "task"?, "user_id"?}  admin or tenant key
    POST /rl/set_reward     {"reward", "interaction_id"?, "session_id"?, "source"?}
    POST /rl/event          {"type", "name", ...} a tool / retrieval / memory / approval event
    POST /rl/end_session    {"session_id"?, "success"?, "info"?}  -> also the session's cost_usd
    POST /rl/session_cost   {"session_id"?}                      -> {"session_id", "cost_usd"}
    POST /rl/export         {"tenant"?, "session_id"?, "eligible_only"?, "include_open"?}
    POST /rl/delete         {"tenant"?, "session_id" | "user_id" | "trajectory_ids", "reason"?}
    POST /rl/withdraw_consent {"tenant"?, "session_id" | "user_id" | "trajectory_ids"}
    POST /rl/pause, /rl/continue, /rl/update_weights {"version"?, "path", "step"?}   admin
    GET, PUT /rl/control/{tenant}[/history|/versions/N|/diff], POST .../rollback       admin
        each tenant's versioned composite policy (`control_routes.py`)
    GET  /health, /metrics                          no key

Errors use OpenAI's JSON shape (`serving.common.errors`).
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

from aiohttp import web
from prometheus_client import CollectorRegistry

from serving.common.errors import ApiError, bad_request, read_json_object
from serving.common.http import new_app
from serving.common.ids import session_of
from serving.common.metrics import metrics_handler
from serving.common.openai_requests import parse_chat_request, parse_completion_request
from serving.common.responses_requests import parse_responses_request
from serving.control.canary import CanaryBook
from serving.control.store import CompositeStore
from serving.gateway.audit import GatewayAudit
from serving.gateway.auth import Principal, authenticate, owned_session, require_admin
from serving.gateway.config import GatewayConfig
from serving.gateway.control_routes import add_control_routes
from serving.gateway.data_requests import SELECTORS, parse_data_request
from serving.gateway.gateway import Gateway
from serving.gateway.sessions import SessionTable
from serving.gateway.tenants import TenantDirectory
from serving.proxy.client import HttpProxyClient, ProxyClient
from serving.proxy.events import parse_event
from serving.router.client import HttpRouterClient, RouterClient
from serving.worker.client import HttpWorkerClient, WorkerClient

GATEWAY = web.AppKey("gateway", Gateway)
AUDIT = web.AppKey("audit", GatewayAudit)
SSE_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}


def _principal(request: web.Request) -> Principal:
    gateway = request.app[GATEWAY]
    return authenticate(request, gateway.config.admin_key, gateway.tenants, gateway.sessions)


@web.middleware
async def count_requests(request: web.Request, handler) -> web.StreamResponse:
    start = time.monotonic()
    resource = request.match_info.route.resource
    endpoint = resource.canonical if resource is not None else "unknown"
    response = await handler(request)
    metrics = request.app[GATEWAY].metrics
    metrics.requests.labels(endpoint, str(response.status)).inc()
    metrics.seconds.labels(endpoint).observe(time.monotonic() - start)
    return response


async def _send(
    request: web.Request, result: dict[str, Any] | AsyncIterator[bytes]
) -> web.StreamResponse:
    if isinstance(result, dict):
        return web.json_response(result)
    response = web.StreamResponse(headers=SSE_HEADERS)
    await response.prepare(request)
    try:
        async for data in result:
            await response.write(data)
    except (ConnectionResetError, ConnectionError):
        # The client went away; closing the iterator cancels the generation.
        await result.aclose()
        return response
    await response.write_eof()
    return response


# ------------------------------------------------------------------------- OpenAI API


async def _parsed(parse, body: dict[str, Any]):
    """Validate a completion body on a worker thread: a huge conversation takes long enough to
    check that the event loop (every other request, /health) must not wait for it."""
    return await asyncio.to_thread(parse, body)


async def chat_completions(request: web.Request) -> web.StreamResponse:
    principal = _principal(request)
    body = await read_json_object(request)
    result = await request.app[GATEWAY].complete(principal, await _parsed(parse_chat_request, body))
    return await _send(request, result)


async def completions(request: web.Request) -> web.StreamResponse:
    principal = _principal(request)
    body = await read_json_object(request)
    parsed = await _parsed(parse_completion_request, body)
    result = await request.app[GATEWAY].complete(principal, parsed)
    return await _send(request, result)


async def create_response(request: web.Request) -> web.StreamResponse:
    principal = _principal(request)
    body = await read_json_object(request)
    parsed = await _parsed(parse_responses_request, body)
    result = await request.app[GATEWAY].respond(principal, parsed)
    return await _send(request, result)


async def get_response(request: web.Request) -> web.Response:
    principal = _principal(request)
    gateway = request.app[GATEWAY]
    return web.json_response(gateway.stored_response(principal, request.match_info["id"]))


def _model_entry(info: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": info["model_id"],
        "object": "model",
        "created": 0,
        "owned_by": "sao_jax",
        "context_length": info["context_length"],
        "policy_version": info.get("policy_version"),
    }


async def list_models(request: web.Request) -> web.Response:
    _principal(request)
    models = await request.app[GATEWAY].models()
    return web.json_response({"object": "list", "data": [_model_entry(m) for m in models]})


async def get_model(request: web.Request) -> web.Response:
    _principal(request)
    gateway = request.app[GATEWAY]
    model = request.match_info["model"]
    await gateway.check_model(model)
    info = next(m for m in await gateway.models() if m["model_id"] == model)
    return web.json_response(_model_entry(info))


# ------------------------------------------------------------------------- RL sessions


def _optional(body: dict, name: str, kind: type | tuple[type, ...]) -> Any:
    value = body.get(name)
    if value is not None and (
        not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool)
    ):
        names = kind.__name__ if isinstance(kind, type) else "/".join(k.__name__ for k in kind)
        raise bad_request(f"'{name}' must be a {names}", param=name)
    return value


async def start_session(request: web.Request) -> web.Response:
    principal = _principal(request)
    gateway = request.app[GATEWAY]
    body = await read_json_object(request)
    tenant = _optional(body, "tenant", str)
    if principal.kind == "session":
        raise ApiError(403, "a session key cannot start sessions", code="forbidden")
    if principal.kind == "tenant":
        if tenant is not None and tenant != principal.tenant.name:
            raise ApiError(
                403, "a tenant key can only start sessions of its own tenant", param="tenant"
            )
        tenant = principal.tenant.name
    elif tenant is None:
        raise bad_request("'tenant' is required with the admin key", param="tenant")
    task = dict(_optional(body, "task", dict) or {})
    task_id = _optional(body, "task_id", str)
    if task_id is not None:
        task["task_id"] = task_id
    user_id = _optional(body, "user_id", str)
    if user_id is not None:  # the end user, for deletion / consent requests by user
        if not user_id or len(user_id) > 256:
            raise bad_request("'user_id' must be 1 to 256 characters", param="user_id")
        task["user_id"] = user_id
    record, key = await gateway.start_session(tenant, task)
    models = await gateway.models()
    return web.json_response(
        {
            "session_id": record.session_id,
            "api_key": key,
            "tenant": tenant,
            "trajectory_id": record.session_id,
            "model": models[0]["model_id"] if models else None,
        }
    )


async def set_reward(request: web.Request) -> web.Response:
    principal = _principal(request)
    gateway = request.app[GATEWAY]
    body = await read_json_object(request)
    reward = body.get("reward")
    if (
        isinstance(reward, bool)
        or not isinstance(reward, (int, float))
        or not math.isfinite(reward)
    ):
        raise bad_request("'reward' must be a finite number", param="reward")
    interaction_id = _optional(body, "interaction_id", str)
    session_id = _optional(body, "session_id", str)
    if interaction_id is not None:
        implied = session_of(interaction_id)  # our ids name their session
        if implied is None:
            raise ApiError(
                404, f"unknown interaction id {interaction_id!r}", param="interaction_id"
            )
        if session_id is not None and session_id != implied:
            raise bad_request("'interaction_id' belongs to another session", param="interaction_id")
        session_id = implied
    source = _optional(body, "source", str) or "user"
    if principal.kind == "tenant" and session_id and not gateway.sessions.get(session_id):
        # not a started session: a trajectory the data proxy made of tenant-key calls
        # (grouped by prefix, or one call); the proxy looks in this tenant's data only
        result = await gateway.set_unlisted_reward(
            principal.tenant.name, session_id, float(reward), interaction_id, source
        )
        return web.json_response(result)
    record = owned_session(principal, gateway.sessions, session_id)
    result = await gateway.set_reward(record, float(reward), interaction_id, source)
    return web.json_response(result)


async def record_event(request: web.Request) -> web.Response:
    """A tool call, retrieval, memory operation or approval the agent reports
    (`serving/proxy/events.py`), joined to its session's trajectory."""
    principal = _principal(request)
    gateway = request.app[GATEWAY]
    body = await read_json_object(request)
    event = parse_event(body)
    session_id = _optional(body, "session_id", str)
    if event.interaction_id is not None:
        implied = session_of(event.interaction_id)
        if session_id is not None and implied is not None and session_id != implied:
            raise bad_request("'interaction_id' belongs to another session", param="interaction_id")
        session_id = session_id or implied
    if principal.kind == "tenant" and session_id and not gateway.sessions.get(session_id):
        result = await gateway.record_unlisted_event(principal.tenant.name, session_id, event)
        return web.json_response(result)
    record = owned_session(principal, gateway.sessions, session_id)
    if record.ended:
        raise ApiError(409, f"session {record.session_id!r} has ended", code="session_ended")
    return web.json_response(await gateway.record_event(record, event))


async def end_session(request: web.Request) -> web.Response:
    principal = _principal(request)
    gateway = request.app[GATEWAY]
    body = await read_json_object(request)
    session_id = _optional(body, "session_id", str)
    success = _optional(body, "success", bool)
    info = _optional(body, "info", dict) or {}
    if principal.kind == "tenant" and session_id and not gateway.sessions.get(session_id):
        # an implicit trajectory of tenant-key calls: ended by the harness that knows
        result = await gateway.end_unlisted(principal.tenant.name, session_id, success, info)
        return web.json_response(result)
    record = owned_session(principal, gateway.sessions, session_id)
    return web.json_response(await gateway.end_session(record, success, info))


async def session_cost(request: web.Request) -> web.Response:
    principal = _principal(request)
    gateway = request.app[GATEWAY]
    body = await read_json_object(request)
    record = owned_session(principal, gateway.sessions, _optional(body, "session_id", str))
    return web.json_response(await gateway.session_cost(record))


def _caller(principal: Principal) -> str:
    """How a caller appears in the gateway's audit log."""
    if principal.kind == "session":
        return f"session:{principal.session.session_id}"
    return "admin" if principal.is_admin else principal.tenant.name


async def _data_request(request: web.Request, operation: str) -> web.Response:
    """/rl/delete and /rl/withdraw_consent; every call, refused or failed ones too, is audited."""
    gateway, audit = request.app[GATEWAY], request.app[AUDIT]
    entry: dict[str, Any] = {"route": request.path, "principal": "unauthenticated"}
    try:
        principal = _principal(request)
        entry["principal"] = _caller(principal)
        body = await read_json_object(request)
        entry.update(tenant=body.get("tenant"), **{k: body.get(k) for k in SELECTORS})
        parsed = parse_data_request(
            principal,
            body,
            tenants=gateway.tenants,
            sessions=gateway.sessions,
            with_reason=operation == "delete",
        )
        entry.update(tenant=parsed.tenant, reason=parsed.reason)
        ids = await getattr(gateway, operation)(parsed)
    except Exception as error:
        status = getattr(error, "status", 500)  # ApiError, aiohttp's 413; else the 500 answered
        await asyncio.to_thread(audit.record, **entry, status=status, error=str(error))
        raise
    await asyncio.to_thread(audit.record, **entry, status=200, trajectories=ids)
    key = "deleted" if operation == "delete" else "withdrawn"
    return web.json_response({"tenant": parsed.tenant, key: ids, "count": len(ids)})


async def delete_data(request: web.Request) -> web.Response:
    return await _data_request(request, "delete")


async def withdraw_consent(request: web.Request) -> web.Response:
    return await _data_request(request, "withdraw_consent")


async def export(request: web.Request) -> web.StreamResponse:
    principal = _principal(request)
    gateway = request.app[GATEWAY]
    body = await read_json_object(request)
    tenant = _optional(body, "tenant", str)
    if principal.kind == "session":
        raise ApiError(403, "a session key cannot export", code="forbidden")
    if principal.kind == "tenant":
        if tenant is not None and tenant != principal.tenant.name:
            raise ApiError(403, "a tenant key can only export its own tenant", param="tenant")
        tenant, requested_by = principal.tenant.name, principal.tenant.name
    else:
        requested_by = "operator:gateway-admin"
        if tenant is not None:
            gateway.tenants.tenant(tenant)  # 404 for an unknown tenant
    session_id = _optional(body, "session_id", str)
    if session_id is not None:
        tenant = owned_session(principal, gateway.sessions, session_id).tenant
    lines = gateway.export(
        tenant,
        requested_by=requested_by,
        session_id=session_id,
        eligible_only=bool(_optional(body, "eligible_only", bool)),
        include_open=_optional(body, "include_open", bool) is not False,
    )
    first = await anext(lines, None)  # errors surface as a status, not mid-stream
    response = web.StreamResponse(headers={"Content-Type": "application/x-ndjson"})
    await response.prepare(request)
    if first is not None:
        await response.write(first)
        async for data in lines:
            await response.write(data)
    await response.write_eof()
    return response


async def pause(request: web.Request) -> web.Response:
    require_admin(_principal(request))
    return web.json_response({"workers": await request.app[GATEWAY].for_each_worker("pause")})


async def resume(request: web.Request) -> web.Response:
    require_admin(_principal(request))
    return web.json_response({"workers": await request.app[GATEWAY].for_each_worker("resume")})


async def update_weights(request: web.Request) -> web.Response:
    require_admin(_principal(request))
    body = await read_json_object(request)
    path = _optional(body, "path", str)
    if not path:
        raise bad_request("'path' (a checkpoint directory) is required", param="path")
    version = _optional(body, "version", int)
    results = await request.app[GATEWAY].for_each_worker(
        "update_weights", version=version, path=path
    )
    return web.json_response({"workers": results})


async def health(request: web.Request) -> web.Response:
    gateway = request.app[GATEWAY]
    try:
        workers = await gateway.router.workers()
    except ApiError as error:
        return web.json_response({"status": "unavailable", "error": error.message}, status=503)
    alive = [w for w in workers if w["alive"]]
    versions = sorted(
        {w["status"].get("policy_version") for w in alive if w.get("status")} - {None}
    )
    return web.json_response(
        {
            "status": "ok" if alive else "degraded",
            "workers_alive": len(alive),
            "policy_versions": versions,
        },
        status=200 if alive else 503,
    )


def create_app(
    config: GatewayConfig,
    *,
    router: RouterClient | None = None,
    proxies: list[str] | None = None,
    proxy_client: Callable[[str], ProxyClient] | None = None,
    worker_client: Callable[[str], WorkerClient] | None = None,
    registry: CollectorRegistry | None = None,
) -> web.Application:
    """The gateway app. Without clients given, talks HTTP to `config.router` / `config.proxies`
    and to the workers the router lists."""
    app = new_app()
    app.middlewares.insert(0, count_requests)  # outermost: counts error answers too
    service_key = config.service_key or config.admin_key
    owned: list = []
    if router is None:
        if not config.router or not config.proxies:
            raise ValueError("a standalone gateway needs --router URL and --proxies URL[,URL]")
        router = HttpRouterClient(config.router, service_key=service_key)
        owned.append(router)
    if proxy_client is None:
        proxy_clients: dict[str, HttpProxyClient] = {}

        def proxy_client(url: str) -> ProxyClient:
            if url not in proxy_clients:
                proxy_clients[url] = HttpProxyClient(url, service_key=service_key)
                owned.append(proxy_clients[url])
            return proxy_clients[url]

    if worker_client is None:
        worker_clients: dict[str, HttpWorkerClient] = {}

        def worker_client(url: str) -> WorkerClient:
            if url not in worker_clients:
                worker_clients[url] = HttpWorkerClient(url, service_key=service_key)
                owned.append(worker_clients[url])
            return worker_clients[url]

    tenants = (
        TenantDirectory.from_file(config.tenants) if config.tenants else TenantDirectory.open()
    )
    sessions = SessionTable(config.state_dir)
    composites = CompositeStore(Path(config.state_dir) / "composites")
    gateway = Gateway(
        config,
        tenants=tenants,
        sessions=sessions,
        router=router,
        proxies=proxies if proxies is not None else list(config.proxies),
        proxy_client=proxy_client,
        worker_client=worker_client,
        registry=registry,
        composites=composites,
        canaries=CanaryBook(composites),
    )
    app[GATEWAY] = gateway
    audit = GatewayAudit(config.state_dir)
    app[AUDIT] = audit
    app.router.add_post("/v1/chat/completions", chat_completions)
    app.router.add_post("/v1/completions", completions)
    app.router.add_post("/v1/responses", create_response)
    app.router.add_get("/v1/responses/{id}", get_response)
    app.router.add_get("/v1/models", list_models)
    app.router.add_get("/v1/models/{model}", get_model)
    app.router.add_post("/rl/start_session", start_session)
    app.router.add_post("/rl/set_reward", set_reward)
    app.router.add_post("/rl/event", record_event)
    app.router.add_post("/rl/end_session", end_session)
    app.router.add_post("/rl/session_cost", session_cost)
    app.router.add_post("/rl/export", export)
    app.router.add_post("/rl/delete", delete_data)
    app.router.add_post("/rl/withdraw_consent", withdraw_consent)
    app.router.add_post("/rl/pause", pause)
    app.router.add_post("/rl/continue", resume)
    app.router.add_post("/rl/update_weights", update_weights)
    add_control_routes(app, GATEWAY, AUDIT, _principal)
    app.router.add_get("/health", health)
    app.router.add_get("/metrics", metrics_handler(gateway.metrics.registry))

    async def cleanup(app: web.Application):
        yield
        for client in owned:
            await client.close()
        sessions.close()
        audit.close()

    app.cleanup_ctx.append(cleanup)
    return app
