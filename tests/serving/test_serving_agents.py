"""What real agents send, through the official `openai` client against the one-process server
on loopback: the developer role and several system messages, `n` > 1 (n recorded samples),
`max_tokens` at the model's context (clamped), penalties and vendor fields (accepted, recorded
as ignored), reasoning_effort, and strict tool validation answered with a 400 naming the
limit."""

import numpy as np
import openai
import pytest
from serving_harness import WEATHER_TOOL, api, module_server, read_trajectories, session_client

from atdp_io import EventKind
from serving.proxy.conversation import canonical
from serving.proxy.recording import conversation_from_events

MODEL = "sao-test"
TENANT = "acme"


server = module_server()


def llm_events(buffer, session_id):
    trajectory = read_trajectories(buffer, TENANT)[session_id]
    return trajectory, [e for e in trajectory.events if e.kind == EventKind.LLM_CALL]


def test_developer_role_several_systems_and_ignored_fields(server):
    thread, parts, buffer = server
    session_id, client = session_client(thread.url)
    messages = [
        {"role": "developer", "content": "You are terse."},
        {"role": "system", "content": "Never guess."},
        {"role": "user", "content": "look around"},
    ]
    reply = client.chat.completions.create(
        model=MODEL,
        messages=messages,
        max_tokens=6,
        seed=1,
        presence_penalty=0.5,
        frequency_penalty=0.2,
        logit_bias={"5": -100},
        reasoning_effort="high",
        user="end-user-7",
        extra_body={"chat_template_kwargs": {"enable_thinking": False}, "min_p": 0.1},
    )
    assert reply.choices[0].finish_reason in ("stop", "length")
    trajectory, (event,) = llm_events(buffer, session_id)
    tokenizer = parts.worker.tokenizer
    as_system = [{**messages[0], "role": "system"}, *messages[1:]]
    assert event.llm.input_ids.tolist() == tokenizer.encode_chat(as_system)
    extra = event.llm.decoding.extra
    assert extra["ignored_fields"] == [
        "chat_template_kwargs",
        "frequency_penalty",
        "logit_bias",
        "min_p",
        "presence_penalty",
        "user",
    ]
    assert extra["reasoning_effort"] == "high"
    roles = [e.observation["role"] for e in trajectory.events if e.kind == EventKind.MESSAGE]
    assert roles == ["system", "system", "user"]


def test_max_tokens_at_the_context_is_clamped(server):
    thread, _, buffer = server
    session_id, client = session_client(thread.url)
    messages = [{"role": "user", "content": "go"}]
    reply = client.chat.completions.create(
        model=MODEL, messages=messages, max_tokens=512, temperature=0, stop=["o", "e", "a", " "]
    )
    assert reply.choices[0].finish_reason in ("stop", "length")
    _, (event,) = llm_events(buffer, session_id)
    decoding = event.llm.decoding
    prompt = event.llm.input_ids.shape[0]
    assert decoding.max_tokens == 512 - prompt  # the rest of the context
    assert decoding.extra["requested_max_tokens"] == 512
    assert decoding.extra["max_tokens_clamped"] is True
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model=MODEL, messages=messages, max_tokens=2**40)
    assert "2147483647" in str(info.value) and "must be >= 1" not in str(info.value)


def test_n_samples_are_n_recorded_llm_calls(server):
    thread, _, buffer = server
    session_id, client = session_client(thread.url)
    messages = [{"role": "user", "content": "open the drawer"}]
    reply = client.chat.completions.create(
        model=MODEL, messages=messages, n=3, max_tokens=8, seed=5, temperature=1.0
    )
    assert [c.index for c in reply.choices] == [0, 1, 2]
    streamed = list(
        client.chat.completions.create(
            model=MODEL,
            messages=messages,
            n=2,
            max_tokens=8,
            seed=5,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    texts = {0: "", 1: ""}
    for chunk in streamed:
        for choice in chunk.choices:
            texts[choice.index] += choice.delta.content or ""
    # the same seed: the stream's two samples replay the first two of the plain call
    assert texts == {i: reply.choices[i].message.content or "" for i in (0, 1)}
    trajectory, events = llm_events(buffer, session_id)
    assert len(events) == 5
    kinds = [e.kind for e in trajectory.events]
    assert kinds.count(EventKind.MESSAGE) == 1  # the messages once, before the samples
    ids = [choice.model_extra["interaction_id"] for choice in reply.choices]
    assert [e.metadata.interaction_id for e in events[:3]] == ids and ids[0] == reply.id
    assert [e.llm.decoding.extra["sample_index"] for e in events] == [0, 1, 2, 0, 1]
    seeds = [e.llm.decoding.seed for e in events[:3]]
    assert seeds[0] == 5 and len(set(seeds)) == 3
    assert reply.usage.completion_tokens == sum(e.llm.output_ids.shape[0] for e in events[:3])
    assert streamed[-1].usage.completion_tokens == sum(
        e.llm.output_ids.shape[0] for e in events[3:]
    )
    # a reward can name any one choice
    status, answer = api(thread.url, "/rl/set_reward", {"reward": 1.0, "interaction_id": ids[2]})
    assert status == 200 and answer["event_index"] == trajectory.events.index(events[2])


@pytest.mark.parametrize(
    ("change", "fragment"),
    [
        ({"tools": [{**WEATHER_TOOL, "function": {"name": "get weather"}}]}, "[A-Za-z0-9_-]{1,64}"),
        ({"tools": [WEATHER_TOOL, WEATHER_TOOL]}, "must be unique"),
        (
            {
                "tools": [
                    {
                        "type": "function",
                        "function": {"name": "f", "parameters": {"type": "array"}},
                    }
                ]
            },
            '"type": "object"',
        ),
        (
            {
                "messages": [
                    {"role": "user", "content": "hi"},
                    {"role": "tool", "tool_call_id": "call_zz", "content": "18 C"},
                ]
            },
            "'call_zz' answers no tool call",
        ),
        ({"tool_choice": "required"}, "no 'tools' were given"),
    ],
)
def test_invalid_tools_are_a_400_naming_the_limit(server, change, fragment):
    thread, _, buffer = server
    session_id, client = session_client(thread.url)
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], **change}
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(**body)
    assert fragment in info.value.body["message"]
    assert info.value.body["type"] == "invalid_request_error"
    _, events = llm_events(buffer, session_id)
    assert events == []  # nothing recorded


def test_an_agent_may_continue_any_sample_token_exactly(server):
    """Every sample's sampled ids are kept: continuing choice 1 reuses choice 1's ids (the
    conversation the session expects stays sample 0's), and a session rebuilt from its
    trajectory continues from sample 0, as the live one does."""
    thread, _, buffer = server
    session_id, client = session_client(thread.url)
    messages = [{"role": "user", "content": "open the drawer"}]
    reply = client.chat.completions.create(
        model=MODEL, messages=messages, n=2, max_tokens=6, seed=11, temperature=1.0
    )
    ids = [choice.model_extra["interaction_id"] for choice in reply.choices]
    trajectory, _ = llm_events(buffer, session_id)
    expected = [*messages, {"role": "assistant", "content": reply.choices[0].message.content}]
    assert [canonical(m) for m in conversation_from_events(trajectory.events)] == [
        canonical(m) for m in expected
    ]
    for index in (1, 0):
        follow = [
            *messages,
            {"role": "assistant", "content": reply.choices[index].message.content or ""},
            {"role": "user", "content": f"and now {index}?"},
        ]
        client.chat.completions.create(model=MODEL, messages=follow, max_tokens=2, seed=1)
    _, events = llm_events(buffer, session_id)
    continued_1, continued_0 = events[2:]
    for event, sample in ((continued_1, events[1]), (continued_0, events[0])):
        reused = np.concatenate([sample.llm.input_ids, sample.llm.output_ids])
        assert event.metadata.extra["prompt"]["extends"] == sample.metadata.interaction_id
        assert event.llm.input_ids[: reused.shape[0]].tolist() == reused.tolist()
    assert continued_1.metadata.extra["prompt"]["extends"] == ids[1]
