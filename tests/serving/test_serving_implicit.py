"""Unmodified agents (a tenant key, no session): their calls become multi-turn trajectories
grouped by conversation prefix, rewards by completion id find them, and a reward posted after
the trajectory closed reaches the online learner's stream."""

import json
import threading
import time

import grain
import openai
import pytest
from serving_harness import api, local_server, read_trajectories

from atdp_io import AtdpStore, EventKind
from atdp_io.loader import AtdpLoader, LoaderConfig
from atdp_io.rows import extends_previous

MODEL = "sao-test"
KEY = "sk-plain-agent-0123456789abcdef"
LATE_KEY = "sk-late-agent-0123456789abcdef"  # a tenant of its own: the stream sees only its data
IDLE_S = 1.5


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("implicit")
    tenants = root / "tenants.json"
    tenants.write_text(
        json.dumps({"tenants": {"plain": {"api_keys": [KEY]}, "late": {"api_keys": [LATE_KEY]}}})
    )
    buffer = root / "buffer"
    with local_server(buffer, tenants=str(tenants), implicit_idle_s=IDLE_S) as (thread, _):
        yield thread, buffer


def agent_turns(client, first: str, turns: int):
    """An agent that keeps its own history and resends it, as any OpenAI agent does."""
    messages, replies = [{"role": "user", "content": first}], []
    for turn in range(turns):
        reply = client.chat.completions.create(
            model=MODEL, messages=messages, max_tokens=6, temperature=1.0, seed=turn
        )
        replies.append(reply)
        messages += [
            {"role": "assistant", "content": reply.choices[0].message.content or ""},
            {"role": "user", "content": f"next {turn}"},
        ]
    return replies


def implicit_trajectories(buffer):
    return {
        tid: t
        for tid, t in read_trajectories(buffer, "plain").items()
        if t.header.task.get("implicit")
    }


def wait_closed(buffer, trajectory_id, tenant="plain", timeout=30):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        trajectory = read_trajectories(buffer, tenant)[trajectory_id]
        if trajectory.closed:
            return trajectory
        time.sleep(0.2)
    raise AssertionError(f"{trajectory_id} was not closed after {timeout} s idle")


def test_tenant_key_calls_group_into_multi_turn_trajectories(server):
    thread, buffer = server
    client = openai.OpenAI(base_url=thread.url + "/v1", api_key=KEY, max_retries=0)
    before = set(implicit_trajectories(buffer))
    first = agent_turns(client, "open the drawer", 3)
    second = agent_turns(client, "look around the room", 2)
    new = {tid: t for tid, t in implicit_trajectories(buffer).items() if tid not in before}
    by_reply = {}
    for tid, trajectory in new.items():
        for event in trajectory.events:
            if event.kind == EventKind.LLM_CALL:
                by_reply[event.metadata.interaction_id] = tid
    # each agent is one trajectory, whatever the gateway's per-call ids were
    assert len(new) == 2
    assert len({by_reply[r.id] for r in first}) == 1
    assert len({by_reply[r.id] for r in second}) == 1
    assert by_reply[first[0].id] != by_reply[second[0].id]
    trajectory = new[by_reply[first[0].id]]
    calls = [e for e in trajectory.events if e.kind == EventKind.LLM_CALL]
    assert len(calls) == 3 and extends_previous(trajectory)  # token-exact, one growing context
    assert calls[2].metadata.extra["prompt"]["extends"] == first[1].id

    # a reward by completion id, with the tenant key, while the trajectory is open
    status, answer = api(
        thread.url, "/rl/set_reward", {"reward": 0.5, "interaction_id": first[1].id}, KEY
    )
    assert status == 200, answer
    assert answer["event_index"] == [id(e) for e in trajectory.events].index(id(calls[1]))
    # the trajectory closes once the agent stops calling; a reward still finds it afterwards
    closed = wait_closed(buffer, by_reply[first[0].id])
    assert closed.outcome.info == {"implicit_closed": "idle"}
    status, answer = api(
        thread.url, "/rl/set_reward", {"reward": 1.0, "interaction_id": first[2].id}, KEY
    )
    assert status == 200, answer
    rewards = read_trajectories(buffer, "plain")[closed.trajectory_id].annotations
    assert sorted(a.reward.value for a in rewards) == [0.5, 1.0]
    # a call extending a closed trajectory starts a new one
    messages = [
        {"role": "user", "content": "open the drawer"},
        {"role": "assistant", "content": first[0].choices[0].message.content or ""},
        {"role": "user", "content": "again"},
    ]
    again = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=2)
    assert again.id.split("-")[1] != closed.trajectory_id


def test_unknown_and_foreign_completion_ids_are_404(server):
    thread, _ = server
    status, answer = api(
        thread.url,
        "/rl/set_reward",
        {"reward": 1.0, "interaction_id": "chatcmpl-nosuchsession-abcdefghijkl"},
        KEY,
    )
    assert status == 404, answer


def test_a_tenant_key_ends_its_implicit_trajectory(server):
    thread, buffer = server
    client = openai.OpenAI(base_url=thread.url + "/v1", api_key=KEY, max_retries=0)
    (reply,) = agent_turns(client, "put the mug away", 1)
    session_id = reply.id.split("-")[1]
    body = {"session_id": session_id, "success": True, "info": {"steps": 1}}
    status, answer = api(thread.url, "/rl/end_session", body, KEY)
    assert status == 200 and answer["ended"] is True, answer
    trajectory = read_trajectories(buffer, "plain")[session_id]
    assert trajectory.outcome.success is True and trajectory.outcome.info == {"steps": 1}
    status, answer = api(thread.url, "/rl/end_session", body, KEY)
    assert status == 409, answer  # already ended
    status, answer = api(thread.url, "/rl/end_session", {"session_id": session_id}, LATE_KEY)
    assert status == 404, answer  # another tenant's key does not find it


def test_a_reward_after_close_reaches_the_learner_stream(server):
    thread, buffer = server
    client = openai.OpenAI(base_url=thread.url + "/v1", api_key=LATE_KEY, max_retries=0)
    (reply,) = agent_turns(client, "take the apple", 1)
    session_id = reply.id.split("-")[1]
    wait_closed(buffer, session_id, tenant="late")
    # the online learner's loader: it reads the live buffer while the agent keeps going
    store = AtdpStore.open(str(buffer), create=False)
    loader = AtdpLoader(
        store,
        ["late"],
        principal="late",
        config=LoaderConfig(rows=8, seq_len=512, layout="windowed", reward_grace_s=120.0),
        shard=grain.sharding.ShardOptions(shard_index=0, shard_count=1),
    )
    batches = []
    iterator = iter(loader.stream(poll_interval_s=0.05, idle_timeout_s=5.0))
    reader = threading.Thread(target=lambda: batches.extend(iterator))
    reader.start()
    time.sleep(1.0)
    assert not batches  # closed, but held back: no reward yet
    # the episode is judged after it closed (a grader, a user's thumbs up)
    status, answer = api(
        thread.url, "/rl/set_reward", {"reward": 3.0, "interaction_id": reply.id}, LATE_KEY
    )
    assert status == 200, answer
    reader.join(timeout=120)
    assert len(batches) == 1
    assert float(batches[0]["rewards"].sum()) == pytest.approx(3.0)  # trained with its reward
