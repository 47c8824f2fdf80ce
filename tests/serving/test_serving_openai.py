"""The one-process server through the official `openai` client: plain, streaming and tool
calls, logprobs, completions, sessions and rewards, and what lands in the ATDP buffer."""

import dataclasses
import json
import time

import httpx
import numpy as np
import openai
import pytest
from serving_harness import (
    ADMIN_KEY,
    TOOL_MESSAGES,
    WEATHER_TOOL,
    api,
    local_server,
    read_trajectories,
    shared_worker,
    tool_model,
)

from atdp_io import ActionKind, EventKind, LateReward, ReplayClass
from atdp_io.codec import trajectory_from_export
from sao_jax.rollout.weights import WeightPublisher
from serving.common.errors import ApiError
from serving.common.model_source import template_fingerprint
from serving.gateway.client import GatewayClient
from serving.worker.service import Worker

MODEL = "sao-test"
TENANT = "acme"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    buffer = tmp_path_factory.mktemp("buffer")
    with local_server(buffer) as (thread, parts):
        yield thread, parts, buffer


def start_session(url, tenant=TENANT, **body):
    status, answer = api(url, "/rl/start_session", {"tenant": tenant, "task_id": "t-1", **body})
    assert status == 200, answer
    return answer


def client_for(url, key):
    return openai.OpenAI(base_url=url + "/v1", api_key=key, max_retries=0, timeout=120)


def llm_events(trajectory):
    return [e for e in trajectory.events if e.kind == EventKind.LLM_CALL]


def test_models_health_and_metrics(server):
    thread, _, _ = server
    session = start_session(thread.url)
    models = client_for(thread.url, session["api_key"]).models.list()
    assert [m.id for m in models.data] == [MODEL]
    assert models.data[0].context_length == 512
    status, health = api(thread.url, "/health", key=None, method="GET")
    assert status == 200 and health["workers_alive"] == 1
    status, text = api(thread.url, "/metrics", key=None, method="GET")
    assert status == 200 and "sao_worker_generated_tokens_total" in text
    assert "sao_gateway_requests_total" in text and "sao_proxy_events_recorded_total" in text


def test_chat_is_recorded_losslessly(server):
    thread, parts, buffer = server
    session = start_session(thread.url)
    client = client_for(thread.url, session["api_key"])
    messages = [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "go to the cabinet 1"},
    ]
    reply = client.chat.completions.create(
        model=MODEL,
        messages=messages,
        temperature=0.7,
        top_p=0.9,
        max_tokens=12,
        seed=3,
        logprobs=True,
    )
    choice = reply.choices[0]
    assert choice.finish_reason in ("stop", "length") and reply.usage.completion_tokens <= 12
    assert reply.system_fingerprint == template_fingerprint(tool_model().tokenizer)
    again = client_for(thread.url, start_session(thread.url)["api_key"]).chat.completions.create(
        model=MODEL, messages=messages, temperature=0.7, top_p=0.9, max_tokens=12, seed=3
    )
    assert again.choices[0].message.content == choice.message.content  # seeded: replayable

    trajectory = read_trajectories(buffer, TENANT)[session["session_id"]]
    kinds = [e.kind for e in trajectory.events]
    assert kinds == [EventKind.MESSAGE, EventKind.MESSAGE, EventKind.LLM_CALL]
    assert trajectory.events[1].observation == {"role": "user", "content": "go to the cabinet 1"}
    event = trajectory.events[2]
    call = event.llm
    tokenizer = parts.worker.tokenizer
    assert call.input_ids.tolist() == tokenizer.encode_chat(messages)
    assert call.output_ids.shape[0] == reply.usage.completion_tokens
    recorded = [c.logprob for c in choice.logprobs.content]
    np.testing.assert_allclose(call.output_logprobs, recorded, atol=1e-6)
    assert (call.decoding.temperature, call.decoding.top_p, call.decoding.seed) == (0.7, 0.9, 3)
    assert call.decoding.max_tokens == 12 and call.policy_version == 0
    assert call.prompt_template_fingerprint == reply.system_fingerprint
    assert call.system_prompt_version.startswith("sha256:")
    assert event.replay == ReplayClass.DETERMINISTIC
    assert event.metadata.interaction_id == reply.id
    assert event.action.text == choice.message.content
    assert tokenizer.decode(call.output_ids.tolist(), skip_special_tokens=True).startswith(
        choice.message.content
    )


def test_streaming_matches_plain_and_is_recorded(server):
    thread, _, buffer = server
    session = start_session(thread.url)
    client = client_for(thread.url, session["api_key"])
    messages = [{"role": "user", "content": "open the fridge"}]
    plain = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=16, seed=8)
    chunks = list(
        client.chat.completions.create(
            model=MODEL,
            messages=messages,
            max_tokens=16,
            seed=8,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == plain.choices[0].message.content
    finishes = [
        c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason
    ]
    assert finishes == [plain.choices[0].finish_reason]
    assert chunks[-1].usage.completion_tokens == plain.usage.completion_tokens
    assert all(c.id == chunks[0].id for c in chunks)
    trajectory = read_trajectories(buffer, TENANT)[session["session_id"]]
    calls = llm_events(trajectory)
    assert [e.metadata.interaction_id for e in calls] == [plain.id, chunks[0].id]
    assert calls[0].llm.output_ids.tolist() == calls[1].llm.output_ids.tolist()
    # the second call resent the same conversation (no new messages were recorded for it),
    # and it did not extend the first reply: flagged as a rewritten context
    assert [e.kind for e in trajectory.events].count(EventKind.MESSAGE) == 1
    assert calls[1].metadata.extra.get("context_rewritten") is True


def test_tool_call_round_trip(server):
    thread, _, buffer = server
    session = start_session(thread.url)
    client = client_for(thread.url, session["api_key"])
    first = client.chat.completions.create(
        model=MODEL, messages=TOOL_MESSAGES, tools=[WEATHER_TOOL], temperature=0, max_tokens=40
    )
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls" and not choice.message.content
    (call,) = choice.message.tool_calls
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Paris"}
    messages = [
        *TOOL_MESSAGES,
        choice.message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": "18 C and sunny"},
    ]
    second = client.chat.completions.create(
        model=MODEL, messages=messages, tools=[WEATHER_TOOL], temperature=0, max_tokens=8
    )
    streamed = list(
        client.chat.completions.create(
            model=MODEL,
            messages=TOOL_MESSAGES,
            tools=[WEATHER_TOOL],
            temperature=0,
            max_tokens=40,
            stream=True,
        )
    )
    deltas = [c.choices[0].delta for c in streamed if c.choices]
    tool_deltas = [t for d in deltas for t in (d.tool_calls or [])]
    assert [t.function.name for t in tool_deltas] == ["get_weather"]
    assert json.loads(tool_deltas[0].function.arguments) == {"city": "Paris"}
    assert not "".join(d.content or "" for d in deltas)  # the call never leaks as text
    assert [c.choices[0].finish_reason for c in streamed if c.choices][-1] == "tool_calls"

    events = read_trajectories(buffer, TENANT)[session["session_id"]].events
    kinds = [e.kind for e in events]
    assert kinds[:4] == [
        EventKind.MESSAGE,
        EventKind.LLM_CALL,
        EventKind.TOOL_CALL,
        EventKind.LLM_CALL,
    ]
    llm = events[1]
    assert llm.action.kind == ActionKind.TOOL_CALLS
    (typed,) = llm.action.tool_calls
    assert (typed.name, dict(typed.arguments), typed.call_id) == (
        "get_weather",
        {"city": "Paris"},
        call.id,
    )
    assert typed.argument_schema == WEATHER_TOOL["function"]["parameters"]
    assert llm.llm.tools[0]["function"]["name"] == "get_weather"
    tool = events[2]
    assert tool.result == "18 C and sunny" and tool.action.tool_calls[0].name == "get_weather"
    assert tool.action.tool_calls[0].call_id == call.id and tool.error_class == ""
    assert events[3].metadata.interaction_id == second.id
    # the second prompt is the first one extended by the call and its result, token for token
    first_input = events[1].llm.context_ids.tolist()
    assert events[3].llm.input_ids.tolist()[: len(first_input) - 1] == first_input[:-1]


def test_logprobs_and_top_logprobs(server):
    thread, _, _ = server
    client = client_for(thread.url, start_session(thread.url)["api_key"])
    reply = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "hi"}],
        temperature=0,
        max_tokens=6,
        logprobs=True,
        top_logprobs=3,
    )
    content = reply.choices[0].logprobs.content
    assert len(content) == reply.usage.completion_tokens
    for entry in content:
        assert len(entry.top_logprobs) == 3
        assert entry.top_logprobs[0].token == entry.token  # greedy: the argmax was sampled
        assert abs(entry.top_logprobs[0].logprob - entry.logprob) < 2e-4
        assert entry.top_logprobs[0].logprob >= entry.top_logprobs[1].logprob


def test_completions_endpoint(server):
    thread, parts, buffer = server
    session = start_session(thread.url)
    client = client_for(thread.url, session["api_key"])
    reply = client.completions.create(
        model=MODEL, prompt="You arrive at", max_tokens=7, logprobs=2, seed=4
    )
    choice = reply.choices[0]
    assert len(choice.logprobs.tokens) == reply.usage.completion_tokens
    assert all(len(top) == 2 for top in choice.logprobs.top_logprobs)
    stream = client.completions.create(
        model=MODEL, prompt="You arrive at", max_tokens=7, seed=4, stream=True
    )
    assert "".join(c.choices[0].text for c in stream if c.choices) == choice.text
    event = llm_events(read_trajectories(buffer, TENANT)[session["session_id"]])[0]
    assert event.llm.input_ids.tolist() == parts.worker.tokenizer.encode("You arrive at")
    assert event.metadata.extra["endpoint"] == "completions"


def test_stop_sequence(server):
    thread, parts, buffer = server
    session = start_session(thread.url)
    client = client_for(thread.url, session["api_key"])
    reply = client.chat.completions.create(
        model=MODEL,
        messages=TOOL_MESSAGES,
        tools=[WEATHER_TOOL],
        temperature=0,
        max_tokens=40,
        stop=['"arguments"'],
    )
    choice = reply.choices[0]
    # cut at the last token before the stop sequence (the ' "' token straddles its start);
    # the unfinished call stays visible as text, and the record decodes to exactly that text
    assert choice.finish_reason == "stop" and not choice.message.tool_calls
    assert choice.message.content == '<tool_call>\n{"name": "get_weather",'
    (event,) = llm_events(read_trajectories(buffer, TENANT)[session["session_id"]])
    assert parts.worker.tokenizer.decode(event.llm.output_ids.tolist()) == choice.message.content


def test_rewards_late_rewards_and_end(server):
    thread, _, buffer = server
    session = start_session(thread.url)
    key = session["api_key"]
    client = client_for(thread.url, key)
    first = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "a"}], max_tokens=3
    )
    client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "b"}], max_tokens=3
    )
    status, by_id = api(
        thread.url, "/rl/set_reward", {"reward": 0.5, "interaction_id": first.id}, key
    )
    assert status == 200 and by_id["event_index"] == 1
    status, last = api(thread.url, "/rl/set_reward", {"reward": 1.0}, key)
    assert status == 200 and last["event_index"] == 3
    status, ended = api(thread.url, "/rl/end_session", {"success": True, "info": {"steps": 2}}, key)
    assert status == 200 and ended["ended"]
    status, late = api(thread.url, "/rl/set_reward", {"reward": -1.0, "source": "judge"}, key)
    assert status == 200 and late["event_index"] == 3
    with pytest.raises(openai.ConflictError, match="has ended"):
        client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "c"}], max_tokens=3
        )
    status, again = api(thread.url, "/rl/end_session", {}, key)
    assert status == 409 and again["error"]["code"] == "session_ended"

    trajectory = read_trajectories(buffer, TENANT)[session["session_id"]]
    assert trajectory.closed and trajectory.outcome.success is True
    assert trajectory.outcome.info == {"steps": 2}
    rewards = [
        (a.event_index, a.reward.value, a.reward.source)
        for a in trajectory.annotations
        if isinstance(a, LateReward)
    ]
    assert rewards == [(1, 0.5, "user"), (3, 1.0, "user"), (3, -1.0, "judge")]
    assert all(not e.rewards for e in trajectory.events)  # originals never rewritten
    assert trajectory.header.task == {"task_id": "t-1"}


def test_export_streams_atdp_lines(server):
    thread, _, _ = server
    session = start_session(thread.url, tenant="exporter")
    client_for(thread.url, session["api_key"]).chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "x"}], max_tokens=2
    )
    response = httpx.post(
        thread.url + "/rl/export",
        json={"tenant": "exporter"},
        headers={"Authorization": f"Bearer {ADMIN_KEY}"},
        timeout=60,
    )
    assert response.status_code == 200
    lines = [json.loads(line) for line in response.text.splitlines()]
    assert [line["tenant"] for line in lines] == ["exporter"]
    trajectory = trajectory_from_export(lines[0]["trajectory"])
    assert trajectory.trajectory_id == session["session_id"] and len(llm_events(trajectory)) == 1
    status, _ = api(thread.url, "/rl/export", {"tenant": "exporter"}, session["api_key"])
    assert status == 403
    everything = httpx.post(
        thread.url + "/rl/export",
        json={},
        headers={"Authorization": f"Bearer {ADMIN_KEY}"},
        timeout=60,
    )  # the admin without a tenant: every tenant the data proxy holds
    tenants = {json.loads(line)["tenant"] for line in everything.text.splitlines()}
    assert {"exporter", TENANT} <= tenants


def test_staleness_capacity_is_a_429_until_the_learner_publishes(tmp_path):
    shared = shared_worker()
    config = dataclasses.replace(shared.config, max_staleness=0, staleness_batch_size=1)
    worker = Worker(config, shared.served, sampler=shared.sampler)
    publisher = WeightPublisher()
    worker.follow(publisher)
    with local_server(tmp_path / "buffer", worker=worker) as (thread, _):
        client = client_for(thread.url, start_session(thread.url)["api_key"])
        ask = dict(model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=2)
        client.chat.completions.create(**ask)  # eta=0, batch 1: one sample per policy version
        with pytest.raises(openai.RateLimitError, match="staleness capacity exhausted") as info:
            client.chat.completions.create(**ask)
        assert info.value.response.headers["Retry-After"] == "1"
        version = shared.sampler.policy_version + 1
        publisher.publish(shared.sampler.params, version)  # the learner's next version
        for _ in range(100):
            if worker.engine.status()["policy_version"] == version:
                break
            time.sleep(0.02)
        reply = client.chat.completions.create(**ask)
        assert reply.model_extra["policy_version"] == version
    shared.sampler.update_weights(shared.sampler.params, 0)


def test_gateway_client_drives_a_session(server):
    thread, _, buffer = server
    gateway = GatewayClient(thread.url, ADMIN_KEY)
    session = gateway.start_session("client", task_id="t-9", task={"env": "alfworld", "index": 3})
    reply = session.openai(max_retries=0).chat.completions.create(
        model=session.model, messages=[{"role": "user", "content": "x"}], max_tokens=2
    )
    assert session.set_reward(0.25, interaction_id=reply.id)["event_index"] == 1
    assert gateway.set_reward(1.0, session_id=session.session_id)["event_index"] == 1
    assert session.end(success=False, info={"why": "test"})["ended"]
    (line,) = gateway.export("client")
    assert line["trajectory"]["header"]["task"] == {"env": "alfworld", "index": 3, "task_id": "t-9"}
    with pytest.raises(ApiError) as info:
        session.end()
    assert info.value.status == 409 and info.value.code == "session_ended"
    with pytest.raises(ApiError) as info:
        GatewayClient(thread.url, "sk-nope").start_session("client")
    assert info.value.status == 401
    assert gateway.health()["workers_alive"] == 1
    assert read_trajectories(buffer, "client")[session.session_id].outcome.success is False
