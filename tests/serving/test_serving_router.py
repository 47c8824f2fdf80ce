"""The router: sessions stay pinned, new ones go to the least busy live worker, a dead worker's
sessions move (counted in `Route.moves`), and no live worker is a 503."""

import asyncio

import pytest
from serving_harness import free_port, shared_worker

from serving.common.errors import ApiError
from serving.router.config import RouterConfig
from serving.router.router import Router
from serving.worker.client import HttpWorkerClient, LocalWorkerClient
from serving.worker.generation import GenerationRequest
from serving.worker.service import Worker


def idle_worker() -> Worker:
    """A worker whose engine is not running: submitted requests stay queued (its load)."""
    shared = shared_worker()
    return Worker(shared.config, shared.served, sampler=shared.sampler)


def test_least_busy_placement_pinning_and_moves():
    busy, idle = idle_worker(), idle_worker()
    dead_url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    clients = {
        dead_url: HttpWorkerClient(dead_url, timeout_s=1.0),
        "busy": LocalWorkerClient(busy, "busy"),
        "idle": LocalWorkerClient(idle, "idle"),
    }
    router = Router(RouterConfig(failure_threshold=1, health_interval_s=1.0), ["p"], clients)

    async def scenario():
        request = GenerationRequest((1, 2, 3), max_tokens=4)
        handles = [busy.submit(request) for _ in range(3)]  # queued: the engine is not running
        pinned = router.route("s-dead")  # before any poll all look idle: the first one wins
        await router.poll_once()  # busy reports 3 queued; the unreachable worker is dead
        status = {w["worker"]: w for w in router.workers_status()}
        assert status["busy"]["load"] == 3 and not status[dead_url]["alive"]
        first = router.route("s1")
        second = router.route("s2")
        for handle in handles:
            handle.cancel()
        await clients[dead_url].close()
        return pinned, first, second

    pinned, first, second = asyncio.run(scenario())
    assert pinned.worker == dead_url and pinned.moves == 0
    assert first.worker == "idle"  # least busy among the live ones
    assert second.worker == "idle"  # 1 placed since the poll < 3 queued on "busy"
    assert router.route("s1") == first  # pinned for the session's life
    moved = router.route("s-dead")  # its worker died: moved on its next call
    assert (moved.moves, moved.previous_worker, moved.proxy) == (1, dead_url, pinned.proxy)
    assert router.route("s-dead") == moved
    moved = router.report_failure("s1", "idle")  # a proxy saw "idle" drop a connection
    assert (moved.worker, moved.moves, moved.previous_worker) == ("busy", 1, "idle")
    with pytest.raises(ApiError) as info:
        router.report_failure("s2", "busy")  # the last live worker: nowhere to go
    assert info.value.status == 503 and info.value.code == "no_worker"
    with pytest.raises(ApiError) as info:
        router.route("s3")
    assert info.value.status == 503
    with pytest.raises(ApiError) as info:
        router.report_failure("s1", "nobody")
    assert info.value.status == 400
    router.release("s1")
    assert router.metrics.sessions._value.get() == 2  # s-dead and s2 stay pinned
