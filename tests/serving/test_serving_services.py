"""The four services talking HTTP (each on its own loopback port): least-busy placement over two
workers, re-pinning when a worker dies (also in the middle of a streamed reply), admin pause /
continue and weight updates from an orbax checkpoint."""

import dataclasses

import httpx
import openai
import pytest
from flax import nnx
from serving_harness import (
    ADMIN_KEY,
    ServerThread,
    api,
    free_port,
    read_trajectories,
    shared_worker,
)

from atdp_io import EventKind, ReplayClass
from sao_jax.checkpoint import Checkpointer
from sao_jax.models import init_model
from serving.gateway import app as gateway_app
from serving.gateway.config import GatewayConfig
from serving.proxy import app as proxy_app
from serving.proxy.config import ProxyConfig
from serving.router import app as router_app
from serving.router.config import RouterConfig
from serving.worker import app as worker_app
from serving.worker.service import Worker

KEY = "service-key-for-tests"
MODEL = "sao-test"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """Two workers (sharing one sampler: compiled once), a router, a data proxy, a gateway.
    The workers serve random weights, so replies run to max_tokens."""
    root = tmp_path_factory.mktemp("cluster")
    shared = shared_worker()
    sampler = shared.sampler
    trained = (sampler.params, sampler.policy_version)
    sampler.update_weights(nnx.state(init_model(sampler.config, seed=3)), 0)
    ports = {name: free_port() for name in ("a", "b", "router", "proxy")}
    url = {name: f"http://127.0.0.1:{port}" for name, port in ports.items()}
    config = dataclasses.replace(shared.config, service_key=KEY)
    threads, workers = {}, {}
    for name in ("a", "b"):
        workers[name] = Worker(config, shared.served, sampler=sampler)
        app = worker_app.create_app(config, worker=workers[name])
        threads[name] = ServerThread(app, ports[name])
    router_config = RouterConfig(
        proxies=(url["proxy"],), workers=(url["a"], url["b"]), health_interval_s=0.5,
        failure_threshold=1, service_key=KEY,
    )  # fmt: skip
    threads["router"] = ServerThread(router_app.create_app(router_config), ports["router"])
    proxy_config = ProxyConfig(buffer=str(root / "buffer"), router=url["router"], service_key=KEY)
    threads["proxy"] = ServerThread(proxy_app.create_app(proxy_config), ports["proxy"])
    gateway_config = GatewayConfig(
        admin_key=ADMIN_KEY, state_dir=str(root / "state"), router=url["router"],
        proxies=(url["proxy"],), service_key=KEY,
    )  # fmt: skip
    threads["gateway"] = ServerThread(gateway_app.create_app(gateway_config))
    url["gateway"] = threads["gateway"].url
    yield url, threads, workers, root / "buffer"
    for thread in threads.values():
        thread.stop()
    sampler.update_weights(*trained)


def session(url):
    status, answer = api(url["gateway"], "/rl/start_session", {"tenant": "svc"})
    assert status == 200, answer
    return answer


def client(url, key):
    return openai.OpenAI(base_url=url["gateway"] + "/v1", api_key=key, max_retries=0, timeout=120)


def llm_calls(buffer, session_id):
    events = read_trajectories(buffer, "svc")[session_id].events
    return [e for e in events if e.kind == EventKind.LLM_CALL]


def test_internal_apis_need_the_service_key(cluster):
    url, *_ = cluster
    status, body = api(url["a"], "/status", key=None, method="GET")
    assert status == 401 and body["error"]["code"] == "invalid_api_key"
    status, body = api(url["router"], "/route", {"session_id": "x"}, key="wrong")
    assert status == 401
    status, body = api(url["a"], "/status", key=KEY, method="GET")
    assert status == 200 and body["slots"] == 16


def test_placement_repin_and_stream_continuation(cluster):
    url, threads, workers, buffer = cluster
    first, second = session(url), session(url)
    messages = [{"role": "user", "content": "hello"}]
    for s in (first, second):
        client(url, s["api_key"]).chat.completions.create(
            model=MODEL, messages=messages, max_tokens=4
        )
    placed = {
        s["session_id"]: llm_calls(buffer, s["session_id"])[0].metadata.extra["worker"]
        for s in (first, second)
    }
    assert set(placed.values()) == {url["a"], url["b"]}  # least busy: one session each
    victim = next(s for s in (first, second) if placed[s["session_id"]] == url["a"])

    # Worker a dies while streaming a long reply: the reply continues on b, nothing is lost.
    stream = client(url, victim["api_key"]).chat.completions.create(
        model=MODEL, messages=messages, max_tokens=300, stream=True, seed=1
    )
    chunks = []
    for chunk in stream:
        chunks.append(chunk)
        if len(chunks) == 2:  # mid-reply, worker a shuts down (its engine first, then HTTP)
            workers["a"].stop()
            threads["a"].stop()
    finish = [
        c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason
    ]
    assert finish in (["length"], ["stop"])
    after = client(url, victim["api_key"]).chat.completions.create(
        model=MODEL, messages=messages, max_tokens=3
    )

    calls = llm_calls(buffer, victim["session_id"])
    assert [c.metadata.interaction_id for c in calls] == [
        calls[0].metadata.interaction_id,
        chunks[0].id,
        after.id,
    ]
    assert calls[0].replay == ReplayClass.DETERMINISTIC
    moved = calls[1]
    assert moved.replay == ReplayClass.APPROXIMATE
    streamed = [c for c in chunks if c.choices and c.choices[0].delta.content is not None]
    assert moved.llm.output_ids.size == (300 if finish == ["length"] else moved.llm.output_ids.size)
    assert (
        len({c.id for c in streamed}) == 1
        and moved.metadata.completion_tokens == moved.llm.output_ids.size
    )
    assert moved.metadata.extra["repinned_from"] == url["a"]
    assert moved.metadata.extra["worker"] == url["b"] and moved.metadata.extra["moves"] == 1
    assert calls[2].replay == ReplayClass.APPROXIMATE  # later calls of a moved session too
    status, health = api(url["gateway"], "/health", key=None, method="GET")
    assert status == 200 and health["workers_alive"] == 1


def test_pause_continue_and_weight_update_from_checkpoint(cluster, tmp_path):
    url, _, _, buffer = cluster
    gateway = url["gateway"]
    status, paused = api(gateway, "/rl/pause", {})
    assert status == 200 and all(w["result"]["paused"] for w in paused["workers"])
    status, resumed = api(gateway, "/rl/continue", {})
    assert status == 200 and not any(w["result"]["paused"] for w in resumed["workers"])

    sampler = shared_worker().sampler
    model = init_model(sampler.config, seed=11)
    with Checkpointer(tmp_path / "ckpt", async_save=False) as checkpointer:
        checkpointer.save(3, {"policy": model}, metadata={"policy_version": 5})
    status, updated = api(gateway, "/rl/update_weights", {"path": str(tmp_path / "ckpt")})
    assert status == 200, updated
    assert [w["result"] for w in updated["workers"]] == [5]
    s = session(url)
    reply = client(url, s["api_key"]).chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "x"}], max_tokens=3
    )
    assert reply.model_extra["policy_version"] == 5
    assert llm_calls(buffer, s["session_id"])[0].llm.policy_version == 5
    status, error = api(gateway, "/rl/update_weights", {"path": str(tmp_path / "missing")})
    assert status == 400 and "no checkpoint directory" in error["error"]["message"]
    with httpx.Client() as http:
        response = http.post(
            gateway + "/rl/update_weights",
            json={"path": "x"},
            headers={"Authorization": f"Bearer {s['api_key']}"},
        )
    assert response.status_code == 403
