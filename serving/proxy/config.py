"""Configuration of a data proxy: where it records, and how it reaches the rest."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass
class ProxyConfig:
    """A data proxy process (or the proxy part of `python -m serving`).

    Attributes:
      host: interface to bind (loopback by default).
      port: TCP port of the proxy's internal API.
      buffer: ATDP store this proxy writes (a directory, gs://..., or a kvstore spec); one
        store per proxy, since each tenant partition has a single writer.
      router: router URL (separate-process mode).
      tokenizer: tokenizer.json (or directory) to use; default: fetched from a worker, so the
        proxy renders prompts with exactly the served model's tokenizer.
      request_timeout_s: a generation running longer is ended by the worker ("timeout").
      writer_threads: threads running durable ATDP commits (concurrent sessions share commits).
      cpu_threads: threads rendering and tokenizing requests (kept off the event loop).
      redact_disable: built-in redaction detectors to turn off (e.g. phone), comma separated.
      service_key: bearer key of the internal APIs (None: no check; loopback only).
      prices: JSON price table (USD per 1M prompt / completion tokens per model; see
        docs/serving.md) that fills each call's cost_usd; None: costs stay unknown.
      implicit_idle_s: tenant-key chat calls (no session) are grouped into multi-turn
        trajectories by conversation prefix, each closed after this many seconds without a
        call; None: every such call is a one-call trajectory.
      purge_every_s: seconds between scheduled purges of expired trajectories in every tenant
        of the buffer (the first runs at startup); None: no scheduled purge.
    """

    host: str = "127.0.0.1"
    port: int = 8102
    buffer: str = ""
    router: str | None = None
    tokenizer: str | None = None
    request_timeout_s: float = 600.0
    writer_threads: int = 32
    cpu_threads: int = 4
    redact_disable: tuple[str, ...] = ()
    service_key: str | None = None
    prices: str | None = None
    purge_every_s: float | None = 3600.0
    implicit_idle_s: float | None = 300.0

    def __post_init__(self):
        if not self.buffer:
            raise ValueError("ProxyConfig.buffer (the ATDP store location) is required")
        if self.writer_threads < 1:
            raise ValueError("ProxyConfig.writer_threads must be >= 1")
        if self.cpu_threads < 1:
            raise ValueError("ProxyConfig.cpu_threads must be >= 1")
        if self.request_timeout_s <= 0:
            raise ValueError("ProxyConfig.request_timeout_s must be > 0")
        if self.implicit_idle_s is not None and not self.implicit_idle_s > 0:
            raise ValueError("ProxyConfig.implicit_idle_s must be > 0 seconds (or None: off)")
        if self.purge_every_s is not None and not self.purge_every_s > 0:
            raise ValueError("ProxyConfig.purge_every_s must be > 0 seconds (or None: off)")
