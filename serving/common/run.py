"""Running a service: logging setup and a loopback-first aiohttp server."""

from __future__ import annotations

import logging

from aiohttp import web


def serve(app: web.Application, host: str, port: int, name: str) -> None:
    """Run `app` until interrupted (SIGINT / SIGTERM stop it cleanly)."""
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
    logging.getLogger(name).info("%s listening on http://%s:%d", name, host, port)
    web.run_app(app, host=host, port=port, print=None, access_log=None, shutdown_timeout=10)
