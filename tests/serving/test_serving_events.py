"""Non-LLM boundaries on `/rl/event`: tool calls the agent runs itself, retrieval, memory and
human approvals join the session's trajectory with latency, errors and versions."""

import json

import pytest
from serving_harness import (
    ADMIN_KEY,
    TOOL_MESSAGES,
    WEATHER_TOOL,
    api,
    module_server,
    read_trajectories,
)

from atdp_io import EventKind
from serving.common.errors import ApiError
from serving.gateway.client import GatewayClient

MODEL = "sao-test"


server = module_server()


def test_reported_events_join_the_trajectory(server):
    thread, _, buffer = server
    session = GatewayClient(thread.url, ADMIN_KEY).start_session("acme")
    client = session.openai(max_retries=0)
    reply = client.chat.completions.create(
        model=MODEL, messages=TOOL_MESSAGES, tools=[WEATHER_TOOL], temperature=0, max_tokens=40
    )
    (call,) = reply.choices[0].message.tool_calls
    arguments = json.loads(call.function.arguments)
    with session.timed(
        "tool", "get_weather", call_id=call.id, arguments=arguments, version="weather-2"
    ) as event:
        event.result = {"temperature": 18}
    session.event("retrieval", "docs-index", arguments={"q": "paris"}, result=["doc 1"])
    with pytest.raises(KeyError), session.timed("memory", "notes", arguments={"op": "read"}):
        raise KeyError("no such note")
    session.event("approval", "reviewer-ann", approved=True, call_id=call.id, result="fine")
    # the agent sends the tool result back: already reported, not recorded a second time
    messages = [
        *TOOL_MESSAGES,
        reply.choices[0].message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": '{"temperature": 18}'},
    ]
    client.chat.completions.create(model=MODEL, messages=messages, max_tokens=4)

    events = read_trajectories(buffer, "acme")[session.session_id].events
    tools = [e for e in events if e.kind == EventKind.TOOL_CALL]
    assert len(tools) == 2  # the reported tool call and the memory read; no duplicate
    tool, memory = tools
    assert tool.action.tool_calls[0].name == "get_weather"
    assert tool.action.tool_calls[0].call_id == call.id
    assert tool.action.tool_calls[0].version == "weather-2"
    assert dict(tool.action.tool_calls[0].arguments) == arguments
    assert tool.result == {"temperature": 18} and tool.error_class == ""
    assert tool.metadata.latency_s is not None and tool.metadata.latency_s >= 0
    assert memory.error_class == "memory_error"
    assert memory.metadata.extra["error"].startswith("KeyError")
    (retrieval,) = [e for e in events if e.kind == EventKind.RETRIEVAL]
    assert retrieval.observation == {
        "retriever": "docs-index",
        "query": {"q": "paris"},
        "results": ["doc 1"],
    }
    (approval,) = [e for e in events if e.metadata.extra.get("event_type") == "approval"]
    assert approval.observation["approved"] is True
    assert approval.observation["approver"] == "reviewer-ann"
    # in order: after the completion they follow, before the next one
    kinds = [e.kind for e in events]
    position = {id(e): i for i, e in enumerate(events)}
    first_llm = kinds.index(EventKind.LLM_CALL)
    assert position[id(tool)] > first_llm
    assert kinds.index(EventKind.LLM_CALL, first_llm + 1) > position[id(approval)]


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"name": "x"}, "type"),
        ({"type": "tool"}, "name"),
        ({"type": "approval", "name": "ann"}, "approved"),
        ({"type": "tool", "name": "x", "approved": True}, "approved"),
        ({"type": "tool", "name": "x", "latency_s": -1}, "latency_s"),
        ({"type": "tool", "name": "x", "arguments": [1]}, "arguments"),
        ({"type": "tool", "name": "x", "colour": "red"}, "colour"),
    ],
)
def test_bad_events_are_refused_with_the_field_named(server, body, param):
    thread, _, _ = server
    session = GatewayClient(thread.url, ADMIN_KEY).start_session("acme")
    status, answer = api(thread.url, "/rl/event", body, session.api_key)
    assert status == 400 and answer["error"]["param"] == param, answer


def test_events_need_a_live_session_and_a_known_completion(server):
    thread, _, _ = server
    session = GatewayClient(thread.url, ADMIN_KEY).start_session("acme")
    with pytest.raises(ApiError) as missing:
        session.event("tool", "x", interaction_id=f"chatcmpl-{session.session_id}-abcdefghijkl")
    assert missing.value.status == 404
    session.end()
    with pytest.raises(ApiError) as ended:
        session.event("tool", "x")
    assert ended.value.status == 409
