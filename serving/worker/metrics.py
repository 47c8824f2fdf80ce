"""The worker's Prometheus metrics."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from serving.common.metrics import LATENCY_BUCKETS_S, new_registry


class WorkerMetrics:
    """Counters and gauges of one generation engine (thread-safe, as prometheus_client is)."""

    def __init__(self, registry: CollectorRegistry | None = None):
        r = registry if registry is not None else new_registry()
        self.registry = r
        self.generated_tokens = Counter(
            "sao_worker_generated_tokens", "Tokens sampled by the worker.", registry=r
        )
        self.prompt_tokens = Counter(
            "sao_worker_prompt_tokens", "Prompt tokens prefilled for new requests.", registry=r
        )
        self.prefill_tokens = Counter(
            "sao_worker_prefill_tokens",
            "Prompt tokens encoded (the rest came from a slot's prefix cache).",
            registry=r,
        )
        self.prefix_cached_tokens = Counter(
            "sao_worker_prefix_cached_tokens",
            "Prompt tokens whose keys / values were reused from a slot's cache.",
            registry=r,
        )
        self.finished = Counter(
            "sao_worker_requests_finished",
            "Generations finished, by reason (stop, length, cancelled, timeout, error).",
            ["reason"],
            registry=r,
        )
        self.rejected = Counter(
            "sao_worker_requests_rejected",
            "Requests answered 429, by the binding limit (queue or staleness).",
            ["limit"],
            registry=r,
        )
        self.running = Gauge("sao_worker_slots_busy", "Cache slots holding a request.", registry=r)
        self.queued = Gauge(
            "sao_worker_requests_queued", "Requests waiting for a slot.", registry=r
        )
        self.paused = Gauge("sao_worker_paused", "1 while generation is paused.", registry=r)
        self.policy_version = Gauge(
            "sao_worker_policy_version", "Version of the weights being served.", registry=r
        )
        self.weight_updates = Counter(
            "sao_worker_weight_updates", "Weight swaps applied.", registry=r
        )
        self.decode_seconds = Histogram(
            "sao_worker_decode_dispatch_seconds",
            "Wall time of one multi-step decode dispatch.",
            buckets=LATENCY_BUCKETS_S,
            registry=r,
        )
        self.queue_seconds = Histogram(
            "sao_worker_queue_seconds",
            "Time a request waited for a slot.",
            buckets=LATENCY_BUCKETS_S,
            registry=r,
        )
        self.request_seconds = Histogram(
            "sao_worker_request_seconds",
            "Time from submission to the last token.",
            buckets=LATENCY_BUCKETS_S,
            registry=r,
        )
