"""Constrained decoding through the official `openai` client: forced tool calls (tool_choice
required / named) and JSON output (response_format json_object / json_schema) are valid even
from a model that was never trained on the prompt, thanks to the token mask applied inside the
worker's jitted decode; and every call records the log-probs of the distribution its tokens
were actually drawn from (temperature, top-k, top-p, mask)."""

import json

import numpy as np
import openai
import pytest
from serving_harness import LAMP, module_server, read_trajectories, session_client

from atdp_io import ActionKind, EventKind

MODEL = "sao-test"
TENANT = "acme"
DOOR = {
    "type": "function",
    "function": {
        "name": "open_door",
        "parameters": {
            "type": "object",
            "properties": {"door": {"type": "integer", "minimum": 1, "maximum": 9}},
            "required": ["door"],
            "additionalProperties": False,
        },
    },
}
ANSWER = {
    "type": "object",
    "properties": {"ok": {"type": "boolean"}, "level": {"enum": ["low", "high"]}},
    "required": ["ok", "level"],
    "additionalProperties": False,
}
MESSAGES = [{"role": "user", "content": "open the fridge and look inside"}]


server = module_server()


def llm_events(buffer, session_id):
    events = read_trajectories(buffer, TENANT)[session_id].events
    return [e for e in events if e.kind == EventKind.LLM_CALL]


@pytest.mark.parametrize("seed", [1, 2])
def test_forced_tool_calls_match_their_schema(server, seed):
    thread, _, buffer = server
    session_id, client = session_client(thread.url)
    required = client.chat.completions.create(
        model=MODEL,
        messages=MESSAGES,
        tools=[LAMP, DOOR],
        tool_choice="required",
        max_tokens=120,
        seed=seed,
    )
    choice = required.choices[0]
    assert choice.finish_reason == "tool_calls", choice
    (call,) = choice.message.tool_calls
    arguments = json.loads(call.function.arguments)
    if call.function.name == "set_lamp":
        assert isinstance(arguments["on"], bool) and arguments["room"] in ("hall", "den")
    else:
        assert call.function.name == "open_door" and 1 <= arguments["door"] <= 9
    named = client.chat.completions.create(
        model=MODEL,
        messages=MESSAGES,
        tools=[LAMP, DOOR],
        tool_choice={"type": "function", "function": {"name": "open_door"}},
        max_tokens=120,
        seed=seed,
        stream=True,
    )
    chunks = list(named)
    calls = [t for c in chunks if c.choices for t in c.choices[0].delta.tool_calls or ()]
    assert [t.function.name for t in calls] == ["open_door"]
    assert json.loads(calls[0].function.arguments)["door"] in range(1, 10)
    first, second = llm_events(buffer, session_id)
    assert first.action.kind == ActionKind.TOOL_CALLS
    assert "open_door" in second.llm.decoding.extra["grammar"]
    for event in (first, second):
        sampled = np.asarray(event.llm.decoding.extra["sampled_logprobs"])
        policy = event.llm.output_logprobs
        assert sampled.shape == policy.shape
        # temperature 1, no filter: the mask only renormalizes, so a sampled token's
        # probability can only grow; forced tokens (the tags, the name) have all the mass
        assert np.all(sampled >= policy - 1e-4) and np.isclose(sampled, 0, atol=1e-5).any()


def test_json_schema_and_json_object_outputs(server):
    thread, _, buffer = server
    session_id, client = session_client(thread.url)
    schema_format = {
        "type": "json_schema",
        "json_schema": {"name": "answer", "schema": ANSWER, "strict": True},
    }
    contents = []
    for seed in (3, 4):
        reply = client.chat.completions.create(
            model=MODEL, messages=MESSAGES, response_format=schema_format, max_tokens=80, seed=seed
        )
        assert reply.choices[0].finish_reason == "stop"
        contents.append(reply.choices[0].message.content)
        answer = json.loads(contents[-1])
        assert isinstance(answer["ok"], bool) and answer["level"] in ("low", "high")
    chunks = list(
        client.chat.completions.create(
            model=MODEL,
            messages=MESSAGES,
            response_format=schema_format,
            max_tokens=80,
            seed=3,
            stream=True,
        )
    )
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert streamed == contents[0]  # seed 3 again: the masked sampling replays
    free = client.chat.completions.create(
        model=MODEL,
        messages=MESSAGES,
        response_format={"type": "json_object"},
        max_tokens=60,
        seed=5,
    )
    content = free.choices[0].message.content
    assert content.startswith("{")
    finish = free.choices[0].finish_reason
    assert finish in ("stop", "length"), finish
    # a finished reply is one JSON object; one cut at max_tokens is only a prefix of one
    assert finish == "length" or isinstance(json.loads(content), dict), content
    events = llm_events(buffer, session_id)
    assert events[0].llm.decoding.extra["response_format"]["name"] == "answer"


def test_responses_api_text_format_json_schema(server):
    thread, _, _ = server
    _, client = session_client(thread.url)
    response = client.responses.create(
        model=MODEL,
        input="how is it?",
        text={"format": {"type": "json_schema", "name": "answer", "schema": ANSWER}},
        max_output_tokens=80,
    )
    answer = json.loads(response.output_text)
    assert answer["level"] in ("low", "high")


def test_sampled_logprobs_follow_the_sampling_settings(server):
    thread, _, buffer = server
    session_id, client = session_client(thread.url)
    settings = [
        dict(temperature=1.0),
        dict(temperature=0),
        dict(temperature=0.7, top_p=0.9),
        dict(temperature=1.0, extra_body={"top_k": 1}),
    ]
    for kwargs in settings:
        client.chat.completions.create(
            model=MODEL, messages=MESSAGES, max_tokens=8, seed=9, **kwargs
        )
    plain, greedy, nucleus, top1 = llm_events(buffer, session_id)
    extra = lambda e: np.asarray(e.llm.decoding.extra["sampled_logprobs"])  # noqa: E731
    np.testing.assert_allclose(extra(plain), plain.llm.output_logprobs, atol=1e-5)
    np.testing.assert_allclose(extra(greedy), 0.0, atol=1e-6)  # a point mass
    np.testing.assert_allclose(extra(top1), 0.0, atol=1e-6)
    assert not np.allclose(extra(nucleus), nucleus.llm.output_logprobs, atol=1e-4)
    assert np.all(extra(nucleus) <= 0)


def test_a_bad_schema_is_a_400(server):
    thread, _, _ = server
    _, client = session_client(thread.url)
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(
            model=MODEL,
            messages=MESSAGES,
            response_format={
                "type": "json_schema",
                "json_schema": {"name": "x", "schema": {"type": "object", "required": 3}},
            },
        )
    assert "required must be a list" in info.value.body["message"]


CHOICES = ["look", "open fridge 1", "go to desk 1", "go to desk 12"]  # one a prefix of another


def test_a_choice_list_makes_the_reply_one_of_its_options(server):
    thread, _, buffer = server
    session_id, client = session_client(thread.url)
    replies = []
    for seed in range(4):
        reply = client.chat.completions.create(
            model=MODEL,
            messages=MESSAGES,
            max_tokens=12,
            seed=seed,
            extra_body={"structured_outputs": {"choice": CHOICES}},
        )
        assert reply.choices[0].finish_reason == "stop"
        replies.append(reply.choices[0].message.content)
    assert set(replies) <= set(CHOICES), replies
    legacy = client.chat.completions.create(  # vLLM's older spelling, same constraint
        model=MODEL, messages=MESSAGES, max_tokens=12, seed=0, extra_body={"guided_choice": CHOICES}
    )
    assert legacy.choices[0].message.content == replies[0]
    chunks = client.chat.completions.create(
        model=MODEL,
        messages=MESSAGES,
        max_tokens=12,
        seed=1,
        stream=True,
        extra_body={"structured_outputs": {"choice": CHOICES}},
    )
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == replies[1]
    events = llm_events(buffer, session_id)
    assert len(events) == 6
    for event in events:  # the mask is recorded with the call: training rebuilds it
        extra = event.llm.decoding.extra
        assert extra["choice"] == CHOICES
        assert all(json.dumps(option) in extra["grammar"] for option in CHOICES)
        assert "choice" not in extra.get("ignored_fields", [])


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"structured_outputs": {"choice": []}}, "non-empty list of strings"),
        ({"structured_outputs": {"choice": ["a", 3]}}, "choice[1]' must be a non-empty string"),
        ({"structured_outputs": {"json": {"type": "object"}}}, "supports only 'choice'"),
        ({"structured_outputs": "yes"}, "must be an object"),
        ({"guided_choice": ["a"], "structured_outputs": {"choice": ["a"]}}, "not both"),
        (
            {"guided_choice": ["a"], "response_format": {"type": "json_object"}},
            "one output constraint",
        ),
    ],
)
def test_a_bad_choice_constraint_is_a_400_naming_it(server, body, message):
    thread, _, _ = server
    _, client = session_client(thread.url)
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(
            model=MODEL, messages=MESSAGES, max_tokens=4, extra_body=body
        )
    assert message in info.value.body["message"]
