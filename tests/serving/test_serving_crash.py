"""Crash safety: `python -m serving` killed with SIGKILL under load, then restarted on the same
buffer. Every response a client received is in the buffer and readable; the sessions survive
(their keys still work, rewards still find pre-crash completions, open trajectories resume)."""

import signal
import threading
import time

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

AGENTS = 6
KILL_AFTER = 40  # acknowledged responses before the kill


def serve_args(port: int, buffer) -> list[str]:
    return [
        "serving", "--config", "tiny", "--port", str(port), "--buffer", str(buffer),
        "--admin-key", ADMIN_KEY, "--num-slots", "8", "--context-length", "512",
    ]  # fmt: skip


def agent(url, session, acknowledged, lock, stop):
    """Chat in a loop until told to stop or the server dies (bounded by `stop`)."""
    client = openai.OpenAI(
        base_url=url + "/v1", api_key=session["api_key"], max_retries=0, timeout=60
    )
    for turn in range(1000):
        if stop.is_set():
            return
        try:
            reply = client.chat.completions.create(
                model="sao-tiny",
                messages=[{"role": "user", "content": f"turn {turn}"}],
                max_tokens=6,
            )
        except (openai.APIConnectionError, openai.APIStatusError, httpx.HTTPError):
            return  # the server is gone: whatever was not answered was never acknowledged
        with lock:
            acknowledged.append((session["session_id"], reply.id))


@pytest.mark.slow
def test_kill_9_under_load_loses_no_acknowledged_event(tmp_path):
    buffer, log = tmp_path / "buffer", tmp_path / "server.log"
    env = subprocess_env(tmp_path / "jax_cache")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    server = start_process(serve_args(port, buffer), env, log)
    acknowledged, lock, stop = [], threading.Lock(), threading.Event()
    try:
        wait_healthy(url, server, log)
        sessions = [api(url, "/rl/start_session", {"tenant": "crash"})[1] for _ in range(AGENTS)]
        threads = [
            threading.Thread(target=agent, args=(url, s, acknowledged, lock, stop), daemon=True)
            for s in sessions
        ]
        for thread in threads:
            thread.start()
        deadline = time.monotonic() + 300
        while len(acknowledged) < KILL_AFTER and time.monotonic() < deadline:
            time.sleep(0.05)
        server.send_signal(signal.SIGKILL)  # mid-flight: other requests are being generated
        server.wait(timeout=30)
        stop.set()
        for thread in threads:
            thread.join(timeout=90)
        assert len(acknowledged) >= KILL_AFTER
        received = list(acknowledged)

        stored = read_trajectories(buffer, "crash")  # readable right after the crash
        recorded = {
            e.metadata.interaction_id
            for t in stored.values()
            for e in t.events
            if e.kind == EventKind.LLM_CALL
        }
        missing = [rid for _, rid in received if rid not in recorded]
        assert missing == []
        for session_id, reply_id in received:
            assert reply_id.split("-")[1] == session_id

        server = start_process(serve_args(port, buffer), env, log)
        wait_healthy(url, server, log)
        session = sessions[0]
        before = next(rid for sid, rid in received if sid == session["session_id"])
        status, reward = api(
            url, "/rl/set_reward", {"reward": 1.0, "interaction_id": before}, session["api_key"]
        )
        assert status == 200, reward
        client = openai.OpenAI(
            base_url=url + "/v1", api_key=session["api_key"], max_retries=0, timeout=120
        )
        after = client.chat.completions.create(
            model="sao-tiny",
            messages=[{"role": "user", "content": "after the crash"}],
            max_tokens=4,
        )
        status, _ = api(url, "/rl/end_session", {}, session["api_key"])
        assert status == 200
    finally:
        stop.set()
        stop_process(server)
        print(log.read_text(errors="replace")[-8000:])  # pytest shows it if the test fails
    trajectory = read_trajectories(buffer, "crash")[session["session_id"]]
    ids = [e.metadata.interaction_id for e in trajectory.events if e.kind == EventKind.LLM_CALL]
    assert ids[-1] == after.id and before in ids and trajectory.closed
    (late,) = trajectory.annotations  # the reward found its pre-crash completion
    assert trajectory.events[late.event_index].metadata.interaction_id == before
