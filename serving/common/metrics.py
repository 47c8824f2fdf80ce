"""Prometheus metrics: one registry per process part, exposed at `GET /metrics`.

In the one-process command every part registers into the same registry, so the gateway's
`/metrics` shows the whole server; separate processes expose their own.
"""

from __future__ import annotations

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

LATENCY_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 120.0)


def new_registry() -> CollectorRegistry:
    return CollectorRegistry(auto_describe=True)


def metrics_handler(registry: CollectorRegistry):
    """An aiohttp handler serving `registry` in the Prometheus text format."""

    async def handle(request: web.Request) -> web.Response:
        return web.Response(
            body=generate_latest(registry), headers={"Content-Type": CONTENT_TYPE_LATEST}
        )

    return handle
