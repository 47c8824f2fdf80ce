"""Configuration of the gateway: keys, tenants, where sessions are kept, limits."""

from __future__ import annotations

import dataclasses
import os


@dataclasses.dataclass
class GatewayConfig:
    """The public, OpenAI-compatible entry point.

    Attributes:
      host: interface to bind (loopback by default).
      port: TCP port clients connect to.
      admin_key: key of the operator (start sessions for any tenant, export, pause / continue,
        weight updates). Also read from SAO_ADMIN_KEY when not given.
      tenants: JSON file mapping tenant API keys to governance defaults (see docs/serving.md);
        without it any tenant name may be used with the default governance.
      state_dir: where the session table is kept (sessions.jsonl, appended and fsynced).
      router: router URL (separate-process mode).
      proxies: data proxy URLs (separate-process mode; exports fan out to all of them).
      request_timeout_s: a non-streaming call still unanswered after this long gets a 504.
      max_concurrent_requests: completions in flight at once; beyond it a 429.
      service_key: bearer key of the internal APIs (None: the admin key).
    """

    host: str = "127.0.0.1"
    port: int = 8000
    admin_key: str | None = None
    tenants: str | None = None
    state_dir: str = ""
    router: str | None = None
    proxies: tuple[str, ...] = ()
    request_timeout_s: float = 600.0
    max_concurrent_requests: int = 1024
    service_key: str | None = None

    def __post_init__(self):
        self.admin_key = self.admin_key or os.environ.get("SAO_ADMIN_KEY")
        if not self.admin_key or len(self.admin_key) < 8:
            raise ValueError("an admin key of at least 8 characters is required (--admin-key)")
        if not self.state_dir:
            raise ValueError("GatewayConfig.state_dir (where sessions are kept) is required")
        if self.max_concurrent_requests < 1:
            raise ValueError("GatewayConfig.max_concurrent_requests must be >= 1")
        if self.request_timeout_s <= 0:
            raise ValueError("GatewayConfig.request_timeout_s must be > 0")
        self.proxies = tuple(p.rstrip("/") for p in self.proxies)
