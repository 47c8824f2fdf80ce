"""The worker's internal HTTP API (used by data proxies and the router in other processes).

    POST /generate               GenerationRequest JSON -> JSON lines: chunks, then "finished"
    GET  /status                 load, queue, policy version, staleness capacity
    GET  /info, /tokenizer       served model id / context / fingerprints; the exact tokenizer
    POST /admin/pause            stop dispatching (running requests keep their slots)
    POST /admin/continue
    POST /admin/update_weights   {"version": int?, "path": str, "step": int?}
    GET  /health, /metrics

Every route except /health and /metrics needs the service key when one is configured.
"""

from __future__ import annotations

import json

from aiohttp import web
from prometheus_client import CollectorRegistry

from serving.common.errors import bad_request, read_json_object
from serving.common.http import new_app, require_service_key
from serving.common.metrics import metrics_handler
from serving.worker.config import WorkerConfig
from serving.worker.generation import GenerationRequest
from serving.worker.service import Worker

WORKER = web.AppKey("worker", Worker)


def _worker(request: web.Request) -> Worker:
    worker = request.app[WORKER]
    require_service_key(request, worker.config.service_key)
    return worker


async def generate(request: web.Request) -> web.StreamResponse:
    worker = _worker(request)
    body = await read_json_object(request)
    try:
        generation = GenerationRequest.from_json(body)
    except (TypeError, KeyError, ValueError) as error:
        raise bad_request(f"not a generation request: {error}") from None
    if generation.timeout_s is None:
        generation = _with_timeout(generation, worker.config.request_timeout_s)
    handle = worker.submit(generation)  # 400 / 429 before any byte is streamed
    response = web.StreamResponse(headers={"Content-Type": "application/x-ndjson"})
    await response.prepare(request)
    async for event in handle.events():  # leaving early (client gone) cancels the request
        await response.write(json.dumps(event.to_json()).encode() + b"\n")
    await response.write_eof()
    return response


def _with_timeout(request: GenerationRequest, timeout_s: float) -> GenerationRequest:
    data = request.to_json()
    data["timeout_s"] = timeout_s
    return GenerationRequest.from_json(data)


async def status(request: web.Request) -> web.Response:
    return web.json_response(_worker(request).engine.status())


async def info(request: web.Request) -> web.Response:
    return web.json_response(_worker(request).info())


async def tokenizer(request: web.Request) -> web.Response:
    return web.json_response(_worker(request).tokenizer_json())


async def pause(request: web.Request) -> web.Response:
    worker = _worker(request)
    worker.engine.pause()
    return web.json_response(worker.engine.status())


async def resume(request: web.Request) -> web.Response:
    worker = _worker(request)
    worker.engine.resume()
    return web.json_response(worker.engine.status())


async def update_weights(request: web.Request) -> web.Response:
    worker = _worker(request)
    body = await read_json_object(request)
    path, version, step = body.get("path"), body.get("version"), body.get("step")
    if not isinstance(path, str) or not path:
        raise bad_request("'path' (a checkpoint directory) is required", param="path")
    for name, value in (("version", version), ("step", step)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            raise bad_request(f"'{name}' must be an integer", param=name)
    applied = await worker.update_weights_from_path(path, version, step)
    return web.json_response({"policy_version": applied, **worker.engine.status()})


async def health(request: web.Request) -> web.Response:
    worker = request.app[WORKER]
    return web.json_response({"status": "ok", "policy_version": worker.engine.policy_version})


def create_app(
    config: WorkerConfig,
    *,
    worker: Worker | None = None,
    registry: CollectorRegistry | None = None,
) -> web.Application:
    """The worker app. Builds (and on startup starts) a `Worker` from `config` unless given."""
    app = new_app()
    worker = worker or Worker.from_config(config, registry)
    app[WORKER] = worker
    app.router.add_post("/generate", generate)
    app.router.add_get("/status", status)
    app.router.add_get("/info", info)
    app.router.add_get("/tokenizer", tokenizer)
    app.router.add_post("/admin/pause", pause)
    app.router.add_post("/admin/continue", resume)
    app.router.add_post("/admin/update_weights", update_weights)
    app.router.add_get("/health", health)
    app.router.add_get("/metrics", metrics_handler(worker.metrics.registry))

    async def lifecycle(app: web.Application):
        worker.start()
        yield
        worker.stop()

    app.cleanup_ctx.append(lifecycle)
    return app
