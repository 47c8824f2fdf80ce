"""Configuration of the router: which data proxies and workers exist, and how to watch them."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass
class RouterConfig:
    """The router process (or the router part of `python -m serving`).

    Attributes:
      host: interface to bind (loopback by default).
      port: TCP port of the router's internal API.
      proxies: data proxy URLs, comma separated on the command line.
      workers: worker URLs, comma separated on the command line.
      health_interval_s: how often every worker's /status is polled.
      failure_threshold: consecutive failed polls after which a worker counts as dead (a proxy
        reporting a dropped connection marks it dead at once).
      service_key: bearer key of the internal APIs (None: no check; loopback only).
    """

    host: str = "127.0.0.1"
    port: int = 8103
    proxies: tuple[str, ...] = ()
    workers: tuple[str, ...] = ()
    health_interval_s: float = 2.0
    failure_threshold: int = 2
    service_key: str | None = None

    def __post_init__(self):
        self.proxies = tuple(p.rstrip("/") for p in self.proxies)
        self.workers = tuple(w.rstrip("/") for w in self.workers)
        if self.health_interval_s <= 0:
            raise ValueError("RouterConfig.health_interval_s must be > 0")
        if self.failure_threshold < 1:
            raise ValueError("RouterConfig.failure_threshold must be >= 1")
