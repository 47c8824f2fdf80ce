"""The data proxy's internal HTTP API (the gateway in another process calls it).

    POST /sessions     {"session_id", "tenant", "governance", "task"}: open the trajectory
    POST /chat         {"request": ChatRequest, "call": CallContext} -> body or SSE
    POST /completions  {"request": CompletionRequest, "call": CallContext} -> body or SSE
    POST /reward       {"session_id", "tenant", "value", "interaction_id"?, "source"}
    POST /event        {"session_id", "tenant", "event": /rl/event body} (proxy/events.py)
    POST /end          {"session_id", "tenant", "success"?, "info"}
    POST /export       {"tenant", "session_id"?, "eligible_only", "include_open", "requested_by"}
    POST /delete       {"tenant", "requested_by", "reason", one of "session_id" / "user_id" /
                        "trajectory_ids"} -> {"deleted": [ids]}
    POST /withdraw_consent {"tenant", "requested_by", one selector as /delete} -> {"withdrawn"}
    POST /session_cost {"session_id", "tenant"} -> {"trajectory_id", "cost_usd"}
    GET  /health, /metrics

Requests come from the gateway, which has authenticated the caller; every route except
/health and /metrics needs the service key when one is configured.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import tokenizers
from aiohttp import web
from prometheus_client import CollectorRegistry

from atdp_io import AtdpStore
from sao_jax.tokenizers import HFTokenizer, load_tokenizer
from serving.common.errors import ApiError, bad_request, read_json_object
from serving.common.http import new_app, require_service_key
from serving.common.metrics import metrics_handler, new_registry
from serving.common.model_source import template_fingerprint
from serving.common.openai_requests import ChatRequest, CompletionRequest
from serving.proxy.config import ProxyConfig
from serving.proxy.events import parse_event
from serving.proxy.proxy import DataProxy
from serving.proxy.runner import CallContext
from serving.router.client import HttpRouterClient
from serving.worker.client import HttpWorkerClient

CONFIG = web.AppKey("config", ProxyConfig)
HOLDER = web.AppKey("holder", dict)  # {"proxy": DataProxy} once started (built at startup)


def _proxy(request: web.Request) -> DataProxy:
    require_service_key(request, request.app[CONFIG].service_key)
    proxy = request.app[HOLDER].get("proxy")
    if proxy is None:
        raise ApiError(503, "the data proxy is starting")
    return proxy


def _field(body: dict, name: str, kind: type, *, required: bool = True) -> Any:
    value = body.get(name)
    if value is None and not required:
        return None
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
        raise bad_request(f"'{name}' must be a {kind.__name__}", param=name)
    return value


async def _respond(request: web.Request, result: dict | AsyncIterator[bytes]) -> web.StreamResponse:
    if isinstance(result, dict):
        return web.json_response(result)
    response = web.StreamResponse(
        headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
    )
    await response.prepare(request)
    try:
        async for data in result:
            await response.write(data)
    except ConnectionError:
        # The gateway went away (its client left): closing the stream cancels the generation
        # and records what was generated as `cancelled`.
        await result.aclose()
        return response
    await response.write_eof()
    return response


async def open_session(request: web.Request) -> web.Response:
    proxy = _proxy(request)
    body = await read_json_object(request)
    result = await proxy.open_session(
        _field(body, "session_id", str),
        _field(body, "tenant", str),
        _field(body, "governance", dict),
        _field(body, "task", dict),
    )
    return web.json_response(result)


async def chat(request: web.Request) -> web.StreamResponse:
    proxy = _proxy(request)
    body = await read_json_object(request)
    try:
        chat_request = ChatRequest.from_json(body["request"])
        call = CallContext.from_json(body["call"])
    except (KeyError, TypeError, ValueError) as error:
        raise bad_request(f"malformed proxy call: {error}") from None
    return await _respond(request, await proxy.chat(chat_request, call))


async def completions(request: web.Request) -> web.StreamResponse:
    proxy = _proxy(request)
    body = await read_json_object(request)
    try:
        completion_request = CompletionRequest.from_json(body["request"])
        call = CallContext.from_json(body["call"])
    except (KeyError, TypeError, ValueError) as error:
        raise bad_request(f"malformed proxy call: {error}") from None
    return await _respond(request, await proxy.completion(completion_request, call))


async def reward(request: web.Request) -> web.Response:
    proxy = _proxy(request)
    body = await read_json_object(request)
    value = body.get("value")
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise bad_request("'value' must be a number", param="value")
    result = await proxy.set_reward(
        _field(body, "session_id", str),
        _field(body, "tenant", str),
        float(value),
        interaction_id=_field(body, "interaction_id", str, required=False),
        source=_field(body, "source", str),
    )
    return web.json_response(result)


async def event(request: web.Request) -> web.Response:
    proxy = _proxy(request)
    body = await read_json_object(request)
    result = await proxy.record_event(
        _field(body, "session_id", str),
        _field(body, "tenant", str),
        parse_event(_field(body, "event", dict)),
    )
    return web.json_response(result)


async def end(request: web.Request) -> web.Response:
    proxy = _proxy(request)
    body = await read_json_object(request)
    result = await proxy.end_session(
        _field(body, "session_id", str),
        _field(body, "tenant", str),
        success=_field(body, "success", bool, required=False),
        info=_field(body, "info", dict),
    )
    return web.json_response(result)


async def export(request: web.Request) -> web.StreamResponse:
    proxy = _proxy(request)
    body = await read_json_object(request)
    lines = proxy.export(
        _field(body, "tenant", str, required=False),
        requested_by=_field(body, "requested_by", str),
        session_id=_field(body, "session_id", str, required=False),
        eligible_only=bool(body.get("eligible_only", False)),
        include_open=bool(body.get("include_open", True)),
    )
    response = web.StreamResponse(headers={"Content-Type": "application/x-ndjson"})
    await response.prepare(request)
    async for line in lines:
        await response.write(line)
    await response.write_eof()
    return response


def _selector(body: dict) -> dict[str, Any]:
    """The trajectory selector of /delete and /withdraw_consent (the gateway checked it)."""
    selector = {name: _field(body, name, str, required=False) for name in ("session_id", "user_id")}
    ids = body.get("trajectory_ids")
    if ids is not None:
        if not isinstance(ids, list) or not all(isinstance(i, str) for i in ids):
            raise bad_request("'trajectory_ids' must be a list of strings", param="trajectory_ids")
        selector["trajectory_ids"] = ids
    selector = {k: v for k, v in selector.items() if v is not None}
    if len(selector) != 1:
        raise bad_request("give exactly one of 'session_id', 'user_id', 'trajectory_ids'")
    return selector


async def delete(request: web.Request) -> web.Response:
    proxy = _proxy(request)
    body = await read_json_object(request)
    deleted = await proxy.delete(
        _field(body, "tenant", str),
        requested_by=_field(body, "requested_by", str),
        reason=_field(body, "reason", str),
        **_selector(body),
    )
    return web.json_response({"deleted": deleted})


async def withdraw_consent(request: web.Request) -> web.Response:
    proxy = _proxy(request)
    body = await read_json_object(request)
    withdrawn = await proxy.withdraw_consent(
        _field(body, "tenant", str),
        requested_by=_field(body, "requested_by", str),
        **_selector(body),
    )
    return web.json_response({"withdrawn": withdrawn})


async def session_cost(request: web.Request) -> web.Response:
    proxy = _proxy(request)
    body = await read_json_object(request)
    result = await proxy.session_cost(_field(body, "session_id", str), _field(body, "tenant", str))
    return web.json_response(result)


async def health(request: web.Request) -> web.Response:
    ready = "proxy" in request.app[HOLDER]
    return web.json_response(
        {"status": "ok" if ready else "starting"}, status=200 if ready else 503
    )


async def _tokenizer_from_worker(worker: HttpWorkerClient) -> HFTokenizer:
    spec = await worker.tokenizer()
    backend = tokenizers.Tokenizer.from_str(spec["tokenizer_json"])
    return HFTokenizer(
        backend,
        eos_token=spec["eos_token"],
        pad_token=spec["pad_token"],
        bos_token=spec.get("bos_token"),
    )


def create_app(
    config: ProxyConfig,
    *,
    proxy: DataProxy | None = None,
    registry: CollectorRegistry | None = None,
) -> web.Application:
    """The data proxy app. Without `proxy`, one is built at startup: the store at
    `config.buffer`, the router at `config.router`, model info and (unless `config.tokenizer`)
    the tokenizer from a worker the router knows."""
    app = new_app()
    app[CONFIG] = config
    app[HOLDER] = {}
    if proxy is not None:
        registry = proxy.metrics.registry
    elif registry is None:
        registry = new_registry()
    app.router.add_post("/sessions", open_session)
    app.router.add_post("/chat", chat)
    app.router.add_post("/completions", completions)
    app.router.add_post("/reward", reward)
    app.router.add_post("/event", event)
    app.router.add_post("/end", end)
    app.router.add_post("/export", export)
    app.router.add_post("/delete", delete)
    app.router.add_post("/withdraw_consent", withdraw_consent)
    app.router.add_post("/session_cost", session_cost)
    app.router.add_get("/health", health)
    app.router.add_get("/metrics", metrics_handler(registry))

    async def lifecycle(app: web.Application):
        built = proxy
        clients: dict[str, HttpWorkerClient] = {}
        router = None
        if built is None:
            if not config.router:
                raise ValueError("a standalone data proxy needs --router URL")
            router = HttpRouterClient(config.router, service_key=config.service_key)

            def worker_client(url: str) -> HttpWorkerClient:
                if url not in clients:
                    clients[url] = HttpWorkerClient(url, service_key=config.service_key)
                return clients[url]

            workers = [w for w in await router.workers() if w["alive"]]
            if not workers:
                raise RuntimeError("the router knows no live worker")
            first = worker_client(workers[0]["worker"])
            info = await first.info()
            if config.tokenizer:
                tokenizer = load_tokenizer(config.tokenizer)
                if template_fingerprint(tokenizer) != info["template_fingerprint"]:
                    raise RuntimeError(
                        f"--tokenizer {config.tokenizer} differs from the served model's tokenizer"
                    )
            else:
                tokenizer = await _tokenizer_from_worker(first)
            built = DataProxy(
                config,
                tokenizer=tokenizer,
                model_info=info,
                store=AtdpStore.open(config.buffer),
                router=router,
                worker_client=worker_client,
                registry=registry,
            )
        app[HOLDER]["proxy"] = built
        built.start()
        yield
        await built.close()
        for client in clients.values():
            await client.close()
        if router is not None:
            await router.close()

    app.cleanup_ctx.append(lifecycle)
    return app
