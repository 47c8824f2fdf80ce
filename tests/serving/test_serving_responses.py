"""The Responses API (`POST /v1/responses`) through the official `openai` client's
`client.responses.create`, streamed and not: input items, instructions, function tools and
tool_choice, previous_response_id / store, usage, and the ATDP record (the same as a chat
completion's)."""

import asyncio
import json

import openai
import pytest
from openai.types.responses import ResponseStreamEvent
from pydantic import TypeAdapter
from serving_harness import (
    TOOL_MESSAGES,
    WEATHER_TOOL,
    api,
    module_server,
    read_trajectories,
    session_client,
)

from atdp_io import EventKind
from serving.common.responses_requests import parse_responses_request
from serving.gateway import responses_api
from serving.proxy import responses
from serving.proxy.conversation import canonical
from serving.proxy.proxy import _sse, _text_delta
from serving.proxy.recording import conversation_from_events

MODEL = "sao-test"
TENANT = "acme"
FLAT_WEATHER = {"type": "function", **WEATHER_TOOL["function"]}


server = module_server()


def events_of(buffer, session_id):
    return read_trajectories(buffer, TENANT)[session_id].events


def test_plain_response_is_recorded_like_a_chat_completion(server):
    thread, parts, buffer = server
    session_id, client = session_client(thread.url)
    response = client.responses.create(
        model=MODEL,
        instructions="Be terse.",
        input="look around",
        max_output_tokens=8,
        temperature=0,
        reasoning={"effort": "low"},
        metadata={"run": "a"},
    )
    assert response.object == "response" and response.status in ("completed", "incomplete")
    assert response.instructions == "Be terse." and response.metadata == {"run": "a"}
    (message,) = response.output
    assert message.type == "message" and message.role == "assistant"
    events = events_of(buffer, session_id)
    assert [e.kind for e in events] == [EventKind.MESSAGE, EventKind.MESSAGE, EventKind.LLM_CALL]
    llm = events[2]
    expected = [
        {"role": "system", "content": "Be terse."},
        {"role": "user", "content": "look around"},
    ]
    assert llm.llm.input_ids.tolist() == parts.worker.tokenizer.encode_chat(expected)
    assert llm.metadata.interaction_id == response.id  # the id takes a reward as is
    assert llm.metadata.extra["endpoint"] == "responses"
    assert llm.llm.decoding.extra["reasoning_effort"] == "low"
    assert response.usage.input_tokens == llm.llm.input_ids.shape[0]
    assert response.usage.output_tokens == llm.llm.output_ids.shape[0]
    assert response.output_text == llm.action.text
    if response.status == "incomplete":
        assert response.incomplete_details.reason == "max_output_tokens"
    status, _ = api(thread.url, "/rl/set_reward", {"reward": 1.0, "interaction_id": response.id})
    assert status == 200
    assert client.responses.retrieve(response.id).output_text == response.output_text


def test_tool_round_trip_with_previous_response_id(server):
    thread, parts, buffer = server
    session_id, client = session_client(thread.url)
    first = client.responses.create(
        model=MODEL,
        input=TOOL_MESSAGES[0]["content"],
        tools=[FLAT_WEATHER],
        tool_choice="auto",
        temperature=0,
        max_output_tokens=40,
    )
    (call,) = [item for item in first.output if item.type == "function_call"]
    assert call.name == "get_weather" and json.loads(call.arguments) == {"city": "Paris"}
    assert first.tools[0].name == "get_weather"
    second = client.responses.create(
        model=MODEL,
        previous_response_id=first.id,
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "18 C"}],
        tools=[FLAT_WEATHER],
        temperature=0,
        max_output_tokens=6,
    )
    assert second.previous_response_id == first.id
    events = events_of(buffer, session_id)
    kinds = [e.kind for e in events]
    assert kinds == [EventKind.MESSAGE, EventKind.LLM_CALL, EventKind.TOOL_CALL, EventKind.LLM_CALL]
    assert events[2].result == "18 C" and events[2].action.tool_calls[0].call_id == call.call_id
    conversation = [
        *TOOL_MESSAGES,
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": call.call_id, "function": {"name": call.name, "arguments": call.arguments}}
            ],
        },
        {"role": "tool", "tool_call_id": call.call_id, "content": "18 C"},
    ]
    tokenizer = parts.worker.tokenizer
    assert events[3].llm.input_ids.tolist() == tokenizer.encode_chat(
        conversation, tools=[WEATHER_TOOL]
    )
    # the same conversation sent as explicit input items (no stored state) renders the same
    explicit = client.responses.create(
        model=MODEL,
        input=[
            {"role": "user", "content": TOOL_MESSAGES[0]["content"]},
            {
                "type": "function_call",
                "call_id": call.call_id,
                "name": call.name,
                "arguments": call.arguments,
            },
            {"type": "function_call_output", "call_id": call.call_id, "output": "18 C"},
        ],
        tools=[FLAT_WEATHER],
        temperature=0,
        max_output_tokens=6,
        store=False,
    )
    assert explicit.output_text == second.output_text
    with pytest.raises(openai.NotFoundError):  # store=false: not kept
        client.responses.create(model=MODEL, previous_response_id=explicit.id, input="and?")
    _, other = session_client(thread.url)
    with pytest.raises(openai.NotFoundError):  # another session's response
        other.responses.create(model=MODEL, previous_response_id=first.id, input="and?")


def test_streamed_events_match_the_plain_response(server):
    thread, _, buffer = server
    session_id, client = session_client(thread.url)
    args = dict(model=MODEL, input="open the fridge", temperature=0, max_output_tokens=12)
    plain = client.responses.create(**args)
    events = list(client.responses.create(**args, stream=True))
    kinds = [e.type for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert kinds[-1] in ("response.completed", "response.incomplete")
    assert [e.sequence_number for e in events] == list(range(len(events)))
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert deltas == plain.output_text
    final = events[-1].response
    assert final.output_text == plain.output_text and final.status == plain.status
    assert final.usage.output_tokens == plain.usage.output_tokens
    if plain.output_text:
        assert "response.output_text.done" in kinds and "response.output_item.done" in kinds
    llm = [e for e in events_of(buffer, session_id) if e.kind == EventKind.LLM_CALL]
    assert [e.metadata.interaction_id for e in llm] == [plain.id, final.id]

    tool_events = list(
        client.responses.create(
            model=MODEL,
            input=TOOL_MESSAGES[0]["content"],
            tools=[FLAT_WEATHER],
            temperature=0,
            max_output_tokens=40,
            stream=True,
        )
    )
    done = [e for e in tool_events if e.type == "response.function_call_arguments.done"]
    assert [json.loads(e.arguments) for e in done] == [{"city": "Paris"}]
    (item,) = [o for o in tool_events[-1].response.output if o.type == "function_call"]
    assert item.name == "get_weather" and tool_events[-1].type == "response.completed"


@pytest.mark.parametrize(
    ("change", "fragment"),
    [
        ({"tools": [{"type": "web_search"}]}, "only function tools"),
        ({"input": [{"type": "input_image", "image_url": "x"}]}, "not supported"),
        ({"input": [{"role": "user", "content": [{"type": "input_image"}]}]}, "text parts"),
        ({"input": []}, "must not be empty"),
        ({"tools": [{**FLAT_WEATHER, "name": "a.b"}]}, "[A-Za-z0-9_-]{1,64}"),
        ({"text": {"format": {"type": "yaml"}}}, "json_schema"),
        ({"max_output_tokens": 2**40}, "2147483647"),
        ({"background": True}, "not supported"),
    ],
)
def test_bad_responses_bodies_are_a_400(server, change, fragment):
    thread, _, _ = server
    _, client = session_client(thread.url)
    with pytest.raises(openai.BadRequestError) as info:
        client.responses.create(**{"model": MODEL, "input": "hi", **change})
    assert fragment in info.value.body["message"]


@pytest.mark.parametrize(
    ("text", "finish"),
    [
        ("<think>plan the route</think>go north", "stop"),
        ("<think>still thinking about", "length"),
        (
            '<think>call it</think><tool_call>\n{"name": "get_weather", "arguments": {}}\n</tool_call>',
            "stop",
        ),
    ],
)
def test_reasoning_content_becomes_a_reasoning_item(text, finish):
    """The data proxy's reasoning split (`reasoning_content`, whole and streamed) reaches a
    Responses client as a reasoning item before the answer, streamed as reasoning_text events
    the official client parses; a stored reply leaves it out, as chat clients do."""
    request = parse_responses_request({"model": MODEL, "input": "hi"})
    reply = responses.parse_reply(text, finish, tools_enabled=True)
    common = dict(completion_id="chatcmpl-x", created=1, model=MODEL, system_fingerprint="f")
    completion = responses.chat_completion(
        **common,
        choices=[(reply, None, "chatcmpl-x")],
        usage_counts=responses.usage(3, 5),
        policy_version=0,
    )
    plain = responses_api.from_chat_completion(request, completion)

    chunks = [responses.chat_chunk(**common, delta={"role": "assistant", "content": ""})]
    thinking = responses.ReasoningStreamFilter()  # as the proxy streams a choice
    calls = responses.ToolCallStreamFilter(True)
    pieces = [thinking.feed(text[i : i + 3]) for i in range(0, len(text), 3)]
    for reasoning, content in [*pieces, thinking.flush()]:
        delta = _text_delta(reasoning, calls.feed(content))
        if delta:
            chunks.append(responses.chat_chunk(**common, delta=delta))
    if reply.tool_calls:
        deltas = responses.tool_call_deltas(reply.tool_calls)
        chunks.append(responses.chat_chunk(**common, delta={"tool_calls": deltas}))
    chunks.append(responses.chat_chunk(**common, delta={}, finish_reason=reply.finish_reason))
    chunks.append(responses.chat_chunk(**common, delta=None, usage_counts=responses.usage(3, 5)))

    async def sse():
        for chunk in chunks:
            yield _sse(chunk)
        yield _sse("[DONE]")

    async def translate():
        return [e async for e in responses_api.stream_events(request, sse(), MODEL, stored.append)]

    stored: list = []
    raw = asyncio.run(translate())
    payloads = [json.loads(e.split(b"data: ", 1)[1]) for e in raw]
    # the item, part and reasoning events match the official client's schema exactly
    events = [
        TypeAdapter(ResponseStreamEvent).validate_python(p)
        for p in payloads
        if p["type"].startswith(("response.output_item", "response.content_part", "response.re"))
    ]
    assert "response.reasoning_text.delta" in [e.type for e in events]
    (final,) = stored
    for output in (plain["output"], final["output"]):
        assert output[0]["type"] == "reasoning"
        assert output[0]["content"] == [{"type": "reasoning_text", "text": reply.reasoning}]
        assert [o["type"] for o in output[1:]] == (
            ["function_call"] if reply.tool_calls else ["message"] if reply.content else []
        )
    assert [o["status"] for o in final["output"]] == [o["status"] for o in plain["output"]]
    streamed = "".join(e.delta for e in events if e.type == "response.reasoning_text.delta")
    (done,) = [e.text for e in events if e.type == "response.reasoning_text.done"]
    assert streamed == done == reply.reasoning
    answer = "".join(p["delta"] for p in payloads if p["type"] == "response.output_text.delta")
    assert answer == (reply.content or "")
    stored_reply = responses_api.reply_message(final["output"])
    assert stored_reply["content"] == (reply.content or ("" if not reply.tool_calls else None))
    assert "think" not in json.dumps(stored_reply)


def test_previous_response_id_reuses_the_sampled_ids(server):
    """A stored conversation continues token-exactly: the next call's prompt starts with the
    previous call's input and output ids, and the trajectory's conversation (as a restarted
    proxy rebuilds it) includes the Responses replies."""
    thread, _, buffer = server
    session_id, client = session_client(thread.url)
    first = client.responses.create(
        model=MODEL, input="look around", max_output_tokens=6, temperature=0
    )
    second = client.responses.create(
        model=MODEL,
        input="and now?",
        previous_response_id=first.id,
        max_output_tokens=4,
        temperature=0,
    )
    events = events_of(buffer, session_id)
    before, after = [e for e in events if e.kind == EventKind.LLM_CALL]
    assert after.metadata.extra["prompt"]["extends"] == first.id
    assert "context_rewritten" not in after.metadata.extra
    reused = [*before.llm.input_ids.tolist(), *before.llm.output_ids.tolist()]
    assert after.llm.input_ids[: len(reused)].tolist() == reused
    expected = [
        {"role": "user", "content": "look around"},
        {"role": "assistant", "content": first.output_text},
        {"role": "user", "content": "and now?"},
        {"role": "assistant", "content": second.output_text},
    ]
    assert [canonical(m) for m in conversation_from_events(events)] == [
        canonical(m) for m in expected
    ]
