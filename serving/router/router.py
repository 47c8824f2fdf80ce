"""Session affinity and placement: which data proxy and worker serve a session.

A session is pinned to one data proxy (which holds its open ATDP trajectory) and one worker for
its life. New sessions go to the least busy worker: the running + queued requests it reported
at the last health poll plus the sessions placed on it since. When a worker dies (failed polls,
or a proxy reporting a dropped connection) its sessions are re-pinned to a live worker on their
next call; `Route.moves` counts those moves, and the data proxy records every later event of a
moved session as approximate replay.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Mapping
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge

from serving.common.errors import ApiError
from serving.common.metrics import new_registry
from serving.router.config import RouterConfig
from serving.worker.client import WorkerClient

logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class Route:
    """Where a session's calls go. moves: times the session was re-pinned to a new worker."""

    session_id: str
    proxy: str
    worker: str
    moves: int = 0
    previous_worker: str | None = None

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Route:
        return cls(**data)


@dataclasses.dataclass
class _WorkerHealth:
    alive: bool = True
    failures: int = 0
    reported_load: int = 0
    placed_since_poll: int = 0
    status: dict[str, Any] = dataclasses.field(default_factory=dict)


class RouterMetrics:
    def __init__(self, registry: CollectorRegistry | None = None):
        r = registry if registry is not None else new_registry()
        self.registry = r
        self.placements = Counter("sao_router_placements", "New sessions placed.", registry=r)
        self.repins = Counter("sao_router_repins", "Sessions moved off a dead worker.", registry=r)
        self.workers_alive = Gauge("sao_router_workers_alive", "Workers answering.", registry=r)
        self.sessions = Gauge("sao_router_sessions_pinned", "Sessions with a pin.", registry=r)


class Router:
    """Pins sessions to (proxy, worker) pairs and watches worker health."""

    def __init__(
        self,
        config: RouterConfig,
        proxies: list[str],
        workers: Mapping[str, WorkerClient],
        metrics: RouterMetrics | None = None,
    ):
        if not proxies or not workers:
            raise ValueError("the router needs at least one data proxy and one worker")
        self.config = config
        self.proxies = list(proxies)
        self.workers = dict(workers)
        self.metrics = metrics or RouterMetrics()
        self._health = {name: _WorkerHealth() for name in self.workers}
        self._pins: dict[str, Route] = {}
        self._models: dict[str, dict[str, Any]] = {}
        self.metrics.workers_alive.set(len(self.workers))

    # ------------------------------------------------------------------ placement

    def _live_workers(self, exclude: str | None = None) -> list[str]:
        return [n for n, h in self._health.items() if h.alive and n != exclude]

    def _least_busy_worker(self, exclude: str | None = None) -> str:
        live = self._live_workers(exclude)
        if not live:
            raise ApiError(503, "no worker is available", code="no_worker")
        pinned = {name: 0 for name in live}
        for route in self._pins.values():
            if route.worker in pinned:
                pinned[route.worker] += 1

        def load(name: str) -> tuple[int, int]:
            health = self._health[name]
            return (health.reported_load + health.placed_since_poll, pinned[name])

        return min(live, key=load)

    def _least_busy_proxy(self) -> str:
        counts = {name: 0 for name in self.proxies}
        for route in self._pins.values():
            if route.proxy in counts:
                counts[route.proxy] += 1
        return min(self.proxies, key=lambda name: counts[name])

    def route(self, session_id: str, *, proxy: str | None = None) -> Route:
        """The session's pinned route, placing it first if new (`proxy`: a proxy recorded for
        the session before a router restart). Re-pins a session whose worker died."""
        route = self._pins.get(session_id)
        if route is None:
            if proxy is not None and proxy not in self.proxies:
                raise ApiError(503, f"data proxy {proxy} of this session is not configured")
            worker = self._least_busy_worker()
            route = Route(session_id, proxy or self._least_busy_proxy(), worker)
            self._health[worker].placed_since_poll += 1
            self._pins[session_id] = route
            self.metrics.placements.inc()
            self.metrics.sessions.set(len(self._pins))
        elif not self._health[route.worker].alive:
            route = self._repin(route)
        return route

    def _repin(self, route: Route) -> Route:
        worker = self._least_busy_worker(exclude=route.worker)
        moved = Route(route.session_id, route.proxy, worker, route.moves + 1, route.worker)
        self._health[worker].placed_since_poll += 1
        self._pins[route.session_id] = moved
        self.metrics.repins.inc()
        logger.warning("session %s moved from %s to %s", route.session_id, route.worker, worker)
        return moved

    def report_failure(self, session_id: str, worker: str) -> Route:
        """A proxy could not reach `worker`: mark it dead and re-pin the session."""
        if worker not in self._health:
            raise ApiError(400, f"unknown worker {worker!r}")
        self._mark(worker, alive=False)
        return self.route(session_id)

    def release(self, session_id: str) -> None:
        """Forget an ended session's pin."""
        self._pins.pop(session_id, None)
        self.metrics.sessions.set(len(self._pins))

    # ------------------------------------------------------------------ health

    def _mark(self, worker: str, *, alive: bool) -> None:
        health = self._health[worker]
        if health.alive != alive:
            logger.warning("worker %s is %s", worker, "back" if alive else "dead")
        health.alive = alive
        self.metrics.workers_alive.set(sum(h.alive for h in self._health.values()))

    async def poll_once(self) -> None:
        """Ask every worker for its status; update liveness and load."""

        async def poll(name: str, client: WorkerClient) -> None:
            health = self._health[name]
            try:
                status = await asyncio.wait_for(client.status(), self.config.health_interval_s)
                if name not in self._models:
                    self._models[name] = await asyncio.wait_for(
                        client.info(), self.config.health_interval_s
                    )
            except Exception as error:  # any failure to answer counts against the worker
                health.failures += 1
                if health.failures >= self.config.failure_threshold and health.alive:
                    logger.warning("worker %s failed %d polls: %s", name, health.failures, error)
                    self._mark(name, alive=False)
                return
            health.failures = 0
            health.status = status
            if name in self._models:  # /v1/models shows the version being served now
                self._models[name]["policy_version"] = status.get("policy_version")
            health.reported_load = int(status.get("running", 0)) + int(status.get("queued", 0))
            health.placed_since_poll = 0
            self._mark(name, alive=True)

        await asyncio.gather(*(poll(n, c) for n, c in self.workers.items()))

    async def run_health_checks(self) -> None:
        """Poll forever (run as a background task)."""
        while True:
            await self.poll_once()
            await asyncio.sleep(self.config.health_interval_s)

    def workers_status(self) -> list[dict[str, Any]]:
        return [
            {
                "worker": name,
                "alive": h.alive,
                "load": h.reported_load,
                "failures": h.failures,
                "status": h.status,
            }
            for name, h in self._health.items()
        ]

    def models(self) -> list[dict[str, Any]]:
        """Model info of the workers (model id, context length, fingerprints), as polled."""
        return list(self._models.values())
