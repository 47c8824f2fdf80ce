"""Separate-process mode as an operator runs it: `python -m serving.worker`, `.router`, `.proxy`
and `.gateway`, each its own process on loopback, answering the official openai client."""

import json

import httpx
import openai
import pytest
from serving_harness import (
    ADMIN_KEY,
    api,
    free_port,
    read_trajectories,
    start_process,
    stop_process,
    subprocess_env,
    wait_healthy,
)

from atdp_io import EventKind

KEY = "service-key-processes"


@pytest.mark.slow
def test_four_processes_serve_and_record(tmp_path):
    ports = {name: free_port() for name in ("worker", "router", "proxy", "gateway")}
    url = {name: f"http://127.0.0.1:{port}" for name, port in ports.items()}
    env = subprocess_env(tmp_path / "jax_cache")
    commands = {
        "worker": ["serving.worker", "--config", "tiny", "--num-slots", "4", "--context-length", "256"],
        "router": ["serving.router", "--proxies", url["proxy"], "--workers", url["worker"]],
        "proxy": ["serving.proxy", "--buffer", str(tmp_path / "buffer"), "--router", url["router"]],
        "gateway": [
            "serving.gateway", "--router", url["router"], "--proxies", url["proxy"],
            "--admin-key", ADMIN_KEY, "--state-dir", str(tmp_path / "state"),
        ],
    }  # fmt: skip
    processes = {}
    try:
        for name in ("worker", "router", "proxy", "gateway"):  # each needs the ones before it
            args = [*commands[name], "--port", str(ports[name]), "--service-key", KEY]
            processes[name] = start_process(args, env, tmp_path / f"{name}.log")
            wait_healthy(url[name], processes[name], tmp_path / f"{name}.log")
        status, session = api(
            url["gateway"], "/rl/start_session", {"tenant": "ops", "task_id": "t"}
        )
        assert status == 200, session
        client = openai.OpenAI(
            base_url=url["gateway"] + "/v1", api_key=session["api_key"], max_retries=0, timeout=120
        )
        assert [m.id for m in client.models.list().data] == ["sao-tiny"]
        reply = client.chat.completions.create(
            model="sao-tiny", messages=[{"role": "user", "content": "hello"}], max_tokens=5, seed=1
        )
        streamed = client.chat.completions.create(
            model="sao-tiny", messages=[{"role": "user", "content": "hello"}], max_tokens=5, seed=1,
            stream=True,
        )  # fmt: skip
        assert (
            "".join(c.choices[0].delta.content or "" for c in streamed if c.choices)
            == reply.choices[0].message.content
        )
        status, _ = api(url["gateway"], "/rl/set_reward", {"reward": 1.0}, session["api_key"])
        assert status == 200
        status, _ = api(url["gateway"], "/rl/end_session", {"success": True}, session["api_key"])
        assert status == 200
        response = httpx.post(
            url["gateway"] + "/rl/export", json={"tenant": "ops"},
            headers={"Authorization": f"Bearer {ADMIN_KEY}"}, timeout=60,
        )  # fmt: skip
        (line,) = [json.loads(x) for x in response.text.splitlines()]
        assert line["trajectory"]["header"]["trajectory_id"] == session["session_id"]
        status, metrics = api(url["worker"], "/metrics", key=None, method="GET")
        assert status == 200 and "sao_worker_generated_tokens_total 10.0" in metrics
    finally:
        for process in reversed(processes.values()):
            stop_process(process)
    trajectory = read_trajectories(tmp_path / "buffer", "ops")[session["session_id"]]
    calls = [e for e in trajectory.events if e.kind == EventKind.LLM_CALL]
    assert [c.metadata.interaction_id for c in calls] == [
        reply.id,
        calls[1].metadata.interaction_id,
    ]
    assert calls[0].metadata.extra["worker"] == url["worker"] and trajectory.closed
    assert len(trajectory.annotations) == 1
