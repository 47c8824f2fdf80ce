"""All four services in one process: gateway, router, one data proxy, one worker.

The parts talk through in-process clients (no serialisation, no internal HTTP); only the
gateway listens. `create_local_app` is what `python -m serving` runs, and what tests and the
benchmark build; `LocalServer` keeps handles on the parts for them.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import threading
from collections.abc import Awaitable, Callable
from pathlib import Path

from aiohttp import web

from atdp_io import AtdpStore
from serving.common.metrics import new_registry
from serving.gateway import app as gateway_app
from serving.gateway.config import GatewayConfig
from serving.proxy.client import LocalProxyClient
from serving.proxy.config import ProxyConfig
from serving.proxy.proxy import DataProxy
from serving.proxy.upstream import UpstreamClient, UpstreamProxy, UpstreamWorker
from serving.router.client import LocalRouterClient
from serving.router.config import RouterConfig
from serving.router.router import Router, RouterMetrics
from serving.worker.client import LocalWorkerClient
from serving.worker.config import WorkerConfig
from serving.worker.service import Worker

LOCAL_PROXY = "local-proxy"
LOCAL_WORKER = "local-worker"


@dataclasses.dataclass
class LocalServerConfig:
    """`python -m serving`: the whole server in one process.

    The worker's settings are `worker` (a `WorkerConfig`; on the command line by their own
    names: `--config tiny --num-slots 16`); the proxy's and gateway's are derived here, since
    in one process they share the buffer, the key and the request timeout.

    Attributes:
      host: interface to bind (loopback by default).
      port: TCP port of the OpenAI-compatible API.
      buffer: ATDP store the data proxy writes (directory, gs://..., kvstore spec).
      admin_key: operator key (also read from SAO_ADMIN_KEY).
      tenants: JSON tenants file (API keys -> governance defaults); none: open mode.
      state_dir: where the gateway keeps its session table (default: BUFFER/gateway_state).
      request_timeout_s: longest a completion may run (the worker's; the gateway waits 30 s
        longer, so the worker's timeout fires first).
      writer_threads: threads making ATDP commits durable.
      redact_disable: built-in redaction detectors to turn off, comma separated.
      max_concurrent_requests: completions in flight at the gateway before 429s.
      prices: JSON price table (USD per 1M prompt / completion tokens per model) that fills
        each call's cost_usd; none: costs stay unknown.
      purge_every_s: seconds between scheduled purges of expired trajectories (the first at
        startup); none: no scheduled purge.
      implicit_idle_s: tenant-key chat calls are grouped into multi-turn trajectories by
        conversation prefix, each closed after this many idle seconds; none: one-call
        trajectories.
      upstream: base URL (ending in /v1) of another OpenAI-compatible server to put the
        gateway and data proxy in front of, instead of a JAX worker (model flags are ignored).
      upstream_key: API key the upstream expects (also read from SAO_UPSTREAM_KEY).
      upstream_model: the upstream model to serve (default: the first it lists).
      upstream_token_ids: ask the upstream for token ids (vLLM `return_token_ids`), so calls
        are recorded as trainable llm_call events; only for servers that accept the field.
      worker: the in-process worker (model, batch, admission); its host, port and service
        key mean nothing in one process, its request timeout is `request_timeout_s`.
    """

    host: str = "127.0.0.1"
    port: int = 8000
    buffer: str = ""
    admin_key: str | None = None
    tenants: str | None = None
    state_dir: str | None = None
    request_timeout_s: float = 600.0
    writer_threads: int = 32
    redact_disable: tuple[str, ...] = ()
    max_concurrent_requests: int = 1024
    prices: str | None = None
    purge_every_s: float | None = 3600.0
    implicit_idle_s: float | None = 300.0
    upstream: str | None = None
    upstream_key: str | None = None
    upstream_model: str | None = None
    upstream_token_ids: bool = False
    worker: WorkerConfig = dataclasses.field(
        default_factory=WorkerConfig,
        metadata={"flatten": True, "hide": ("service_key",)},
    )

    def __post_init__(self):
        if not self.buffer:
            raise ValueError("--buffer (the ATDP store to record into) is required")
        self.admin_key = self.admin_key or os.environ.get("SAO_ADMIN_KEY")
        self.upstream_key = self.upstream_key or os.environ.get("SAO_UPSTREAM_KEY")
        if self.state_dir is None:
            if "://" in self.buffer:
                raise ValueError("with a remote --buffer, pass --state-dir (a local directory)")
            self.state_dir = str(Path(self.buffer) / "gateway_state")
        # one request timeout for the process: the worker ends a generation at it
        self.worker = dataclasses.replace(self.worker, request_timeout_s=self.request_timeout_s)

    def proxy_config(self) -> ProxyConfig:
        return ProxyConfig(
            buffer=self.buffer,
            request_timeout_s=self.request_timeout_s,
            writer_threads=self.writer_threads,
            redact_disable=self.redact_disable,
            prices=self.prices,
            purge_every_s=self.purge_every_s,
            implicit_idle_s=self.implicit_idle_s,
        )

    def gateway_config(self) -> GatewayConfig:
        return GatewayConfig(
            host=self.host,
            port=self.port,
            admin_key=self.admin_key,
            tenants=self.tenants,
            state_dir=self.state_dir,
            request_timeout_s=self.request_timeout_s + 30.0,  # the worker's timeout fires first
            max_concurrent_requests=self.max_concurrent_requests,
        )


@dataclasses.dataclass
class LocalServer:
    """Handles on the parts of a one-process server (for tests, benchmarks, the learner)."""

    app: web.Application
    worker: Worker | None  # None in front of an upstream server
    router: Router
    proxy: DataProxy


def create_local_server(config: LocalServerConfig, *, worker: Worker | None = None) -> LocalServer:
    """Build the one-process server; the worker starts with the app and stops with it."""
    if config.upstream:
        return create_upstream_server(config)
    registry = new_registry()
    if worker is None:
        worker = Worker.from_config(config.worker, registry)
    else:  # a worker built beforehand: its metrics join this server's /metrics
        registry.register(worker.metrics.registry)
    worker_client = LocalWorkerClient(worker, name=LOCAL_WORKER)
    router = Router(
        RouterConfig(), [LOCAL_PROXY], {LOCAL_WORKER: worker_client}, RouterMetrics(registry)
    )
    router_client = LocalRouterClient(router)
    proxy = DataProxy(
        config.proxy_config(),
        tokenizer=worker.tokenizer,
        model_info=worker.info(),
        store=AtdpStore.open(config.buffer),
        router=router_client,
        worker_client=lambda name: worker_client,
        registry=registry,
    )

    async def stop_worker() -> None:
        worker.stop()

    app = _gateway(
        config, registry, router, router_client, proxy, worker_client, stop_worker, worker.start
    )
    return LocalServer(app, worker, router, proxy)


def create_upstream_server(config: LocalServerConfig) -> LocalServer:
    """Gateway, router and data proxy in front of `config.upstream` (see `proxy/upstream.py`);
    the upstream must answer `GET /models` now (its model is read at startup)."""
    registry = new_registry()
    upstream = UpstreamClient(
        config.upstream, config.upstream_key, timeout_s=config.request_timeout_s
    )
    worker_client = UpstreamWorker(upstream, config.upstream_model)
    info = _startup_info(worker_client)
    router = Router(
        RouterConfig(), [LOCAL_PROXY], {upstream.name: worker_client}, RouterMetrics(registry)
    )
    router_client = LocalRouterClient(router)
    proxy = UpstreamProxy(
        config.proxy_config(),
        upstream=upstream,
        model_info=info,
        store=AtdpStore.open(config.buffer),
        registry=registry,
        token_ids=config.upstream_token_ids,
    )
    app = _gateway(config, registry, router, router_client, proxy, worker_client, upstream.close)
    return LocalServer(app, None, router, proxy)


def _gateway(
    config: LocalServerConfig,
    registry,
    router: Router,
    router_client: LocalRouterClient,
    proxy: DataProxy,
    worker_client,
    close_backend: Callable[[], Awaitable[None]],
    start_backend: Callable[[], None] = lambda: None,
) -> web.Application:
    """The gateway app over this process's router and proxy; its lifecycle starts the backend,
    the proxy and the router's health checks, and stops them in reverse order."""
    proxy_client = LocalProxyClient(proxy)
    app = gateway_app.create_app(
        config.gateway_config(),
        router=router_client,
        proxies=[LOCAL_PROXY],
        proxy_client=lambda name: proxy_client,
        worker_client=lambda name: worker_client,
        registry=registry,
    )

    async def lifecycle(app: web.Application):
        start_backend()
        proxy.start()
        await router.poll_once()
        health = asyncio.create_task(router.run_health_checks())
        yield
        health.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await health
        await proxy.close()
        await close_backend()

    app.cleanup_ctx.insert(0, lifecycle)
    return app


def _startup_info(worker: UpstreamWorker) -> dict:
    """The upstream's model info, fetched on a private event loop before serving (its HTTP
    session is closed again: the server's loop opens its own)."""

    async def fetch():
        try:
            return await worker.info()
        finally:
            await worker.client.close()

    loop = asyncio.new_event_loop()
    try:
        return loop.run_until_complete(fetch())
    finally:
        loop.close()


class ServerThread:
    """Serves `app` on 127.0.0.1 (a free port, or `port`) from its own event-loop thread: the
    one-process server inside a script, a notebook, a benchmark or a test. `url` once started;
    `call(coroutine)` runs a coroutine on the server's loop; `stop()` shuts it down."""

    def __init__(self, app: web.Application, port: int = 0):
        self.app = app
        self.loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(port,), daemon=True)
        self._thread.start()
        self._ready.wait(timeout=300)
        if self._error is not None:
            raise self._error
        if not self._ready.is_set():
            raise TimeoutError("server did not start")

    def _run(self, port: int) -> None:
        asyncio.set_event_loop(self.loop)
        self.runner = web.AppRunner(self.app, access_log=None, shutdown_timeout=5)
        try:
            self.loop.run_until_complete(self.runner.setup())
            site = web.TCPSite(self.runner, "127.0.0.1", port)
            self.loop.run_until_complete(site.start())
            self.port = site._server.sockets[0].getsockname()[1]
        except BaseException as error:
            self._error = error
            self._ready.set()
            return
        self.url = f"http://127.0.0.1:{self.port}"
        self._ready.set()
        self.loop.run_forever()
        self.loop.run_until_complete(self.runner.cleanup())
        self.loop.close()

    def call(self, coroutine, timeout: float = 120):
        """Run a coroutine on the server's loop (e.g. to touch the parts) and wait for it."""
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout)

    def stop(self) -> None:
        if self.loop.is_running():
            self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=60)
