"""The router's internal HTTP API (for gateways and data proxies in other processes).

POST /route           {"session_id", "proxy"?} -> Route
POST /report_failure  {"session_id", "worker"}  -> the new Route
POST /release         {"session_id"}
GET  /workers         liveness and load of every worker
GET  /models          the served models (as the workers describe them)
GET  /health, /metrics
"""

from __future__ import annotations

import asyncio
import contextlib

from aiohttp import web
from prometheus_client import CollectorRegistry

from serving.common.errors import bad_request, read_json_object
from serving.common.http import new_app, require_service_key
from serving.common.metrics import metrics_handler
from serving.router.config import RouterConfig
from serving.router.router import Router, RouterMetrics
from serving.worker.client import HttpWorkerClient

ROUTER = web.AppKey("router", Router)


def _router(request: web.Request) -> Router:
    router = request.app[ROUTER]
    require_service_key(request, router.config.service_key)
    return router


def _session_id(body: dict) -> str:
    session_id = body.get("session_id")
    if not isinstance(session_id, str) or not session_id:
        raise bad_request("'session_id' is required", param="session_id")
    return session_id


async def route(request: web.Request) -> web.Response:
    router = _router(request)
    body = await read_json_object(request)
    proxy = body.get("proxy")
    if proxy is not None and not isinstance(proxy, str):
        raise bad_request("'proxy' must be a string", param="proxy")
    return web.json_response(router.route(_session_id(body), proxy=proxy).to_json())


async def report_failure(request: web.Request) -> web.Response:
    router = _router(request)
    body = await read_json_object(request)
    worker = body.get("worker")
    if not isinstance(worker, str):
        raise bad_request("'worker' is required", param="worker")
    return web.json_response(router.report_failure(_session_id(body), worker).to_json())


async def release(request: web.Request) -> web.Response:
    router = _router(request)
    router.release(_session_id(await read_json_object(request)))
    return web.json_response({"released": True})


async def workers(request: web.Request) -> web.Response:
    return web.json_response(_router(request).workers_status())


async def models(request: web.Request) -> web.Response:
    return web.json_response(_router(request).models())


async def health(request: web.Request) -> web.Response:
    router = request.app[ROUTER]
    alive = sum(w["alive"] for w in router.workers_status())
    return web.json_response({"status": "ok" if alive else "degraded", "workers_alive": alive})


def create_app(
    config: RouterConfig, *, router: Router | None = None, registry: CollectorRegistry | None = None
) -> web.Application:
    """The router app; builds a `Router` over HTTP worker clients from `config` unless given."""
    app = new_app()
    if router is None:
        clients = {
            url: HttpWorkerClient(url, service_key=config.service_key) for url in config.workers
        }
        router = Router(config, list(config.proxies), clients, RouterMetrics(registry))
    app[ROUTER] = router
    app.router.add_post("/route", route)
    app.router.add_post("/report_failure", report_failure)
    app.router.add_post("/release", release)
    app.router.add_get("/workers", workers)
    app.router.add_get("/models", models)
    app.router.add_get("/health", health)
    app.router.add_get("/metrics", metrics_handler(router.metrics.registry))

    async def health_checks(app: web.Application):
        await router.poll_once()
        task = asyncio.create_task(router.run_health_checks())
        yield
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        for client in router.workers.values():
            await client.close()

    app.cleanup_ctx.append(health_checks)
    return app
