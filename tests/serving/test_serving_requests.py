"""OpenAI request validation: every bad field is a 400 naming it; defaults and aliases."""

import pytest

from serving.common.errors import ApiError
from serving.common.openai_requests import (
    COMPLETIONS_DEFAULT_MAX_TOKENS,
    ChatRequest,
    CompletionRequest,
    parse_chat_request,
    parse_completion_request,
)

MESSAGES = [{"role": "user", "content": "hi"}]


def chat(**fields):
    return parse_chat_request({"model": "m", "messages": MESSAGES, **fields})


def rejects(fn, param, fragment, **fields):
    with pytest.raises(ApiError) as info:
        fn(**fields)
    assert info.value.status == 400
    assert info.value.param == param
    assert fragment in info.value.message
    return info.value


def test_chat_defaults_and_fields():
    request = chat(
        temperature=0.5,
        top_p=0.9,
        max_completion_tokens=7,
        max_tokens=99,
        stop="END",
        seed=11,
        logprobs=True,
        top_logprobs=3,
        stream=True,
        stream_options={"include_usage": True},
        user="agent-1",
    )
    d = request.decoding
    assert (d.temperature, d.top_p, d.max_tokens, d.stop, d.seed) == (0.5, 0.9, 7, ("END",), 11)
    assert (d.logprobs, d.top_logprobs, request.stream, request.include_usage) == (
        True,
        3,
        True,
        True,
    )
    plain = chat()
    assert plain.decoding.max_tokens is None and plain.decoding.temperature == 1.0
    assert plain.tools is None and plain.tool_choice == "auto"


def test_chat_request_survives_the_wire():
    request = chat(stop=["a", "b"], tools=[{"name": "f", "parameters": {}}], seed=3)
    assert ChatRequest.from_json(request.to_json()) == request
    assert request.tools[0]["type"] == "function"  # bare function specs are wrapped


@pytest.mark.parametrize(
    ("fields", "param", "fragment"),
    [
        ({"temperature": "hot"}, "temperature", "must be a number"),
        ({"temperature": 2.5}, "temperature", "[0.0, 2.0]"),
        ({"top_p": 0}, "top_p", "(0, 1]"),
        ({"max_tokens": 0}, "max_tokens", ">= 1"),
        ({"max_tokens": 1.5}, "max_tokens", "integer"),
        ({"stop": ["a", "b", "c", "d", "e"]}, "stop", "at most 4"),
        ({"stop": [""]}, "stop", "empty"),
        ({"stop": 3}, "stop", "string or a list"),
        ({"top_logprobs": 2}, "top_logprobs", "needs 'logprobs'"),
        ({"logprobs": True, "top_logprobs": 21}, "top_logprobs", "[0, 20]"),
        ({"n": 2}, "n", "one choice"),
        ({"presence_penalty": 0.5}, "presence_penalty", "not supported"),
        ({"logit_bias": {"1": 5}}, "logit_bias", "not supported"),
        ({"tool_choice": "required"}, "tool_choice", "'auto' or 'none'"),
        ({"response_format": {"type": "json_object"}}, "response_format", "text"),
        ({"stream_options": {"include_usage": True}}, "stream_options", "stream=true"),
        ({"frobnicate": 1}, "frobnicate", "unrecognized request argument"),
        ({"stream": "yes"}, "stream", "boolean"),
        ({"tools": {"name": "f"}}, "tools", "list"),
        ({"tools": [{"description": "no name"}]}, "tools", "no function name"),
    ],
)
def test_chat_rejects_bad_fields(fields, param, fragment):
    error = rejects(chat, param, fragment, **fields)
    assert error.to_json()["error"]["type"] == "invalid_request_error"


@pytest.mark.parametrize(
    ("messages", "param", "fragment"),
    [
        (None, "messages", "non-empty list"),
        ([], "messages", "non-empty list"),
        ("hi", "messages", "non-empty list"),
        ([{"role": "wizard", "content": "x"}], "messages", "role"),
        ([{"role": "user"}], "messages", "no 'content'"),
        ([{"role": "user", "content": [{"type": "image_url"}]}], "messages", "text parts"),
        ([{"role": "tool", "content": "18 C"}], "messages[0].tool_call_id", "tool_call_id"),
        (
            [{"role": "assistant", "content": None, "tool_calls": [{"function": {}}]}],
            "messages[0].tool_calls",
            "function.name",
        ),
    ],
)
def test_chat_rejects_bad_messages(messages, param, fragment):
    with pytest.raises(ApiError) as info:
        parse_chat_request({"model": "m", "messages": messages})
    assert (info.value.status, info.value.param) == (400, param)
    assert fragment in info.value.message


def test_model_is_required():
    with pytest.raises(ApiError, match="'model' is required") as info:
        parse_chat_request({"messages": MESSAGES})
    assert info.value.param == "model"


def test_completion_prompt_forms_and_defaults():
    text = parse_completion_request({"model": "m", "prompt": "Once"})
    assert text.prompt == "Once"
    assert text.decoding.max_tokens == COMPLETIONS_DEFAULT_MAX_TOKENS
    ids = parse_completion_request({"model": "m", "prompt": [[5, 6, 7]], "logprobs": 2})
    assert ids.prompt == [5, 6, 7]
    assert (ids.decoding.logprobs, ids.decoding.top_logprobs) == (True, 2)
    assert CompletionRequest.from_json(ids.to_json()) == ids


@pytest.mark.parametrize(
    ("fields", "param", "fragment"),
    [
        ({"prompt": ""}, "prompt", "not be empty"),
        ({"prompt": ["a", "b"]}, "prompt", "one prompt per request"),
        ({"prompt": 5}, "prompt", "non-empty string"),
        ({"prompt": "x", "echo": True}, "echo", "not supported"),
        ({"prompt": "x", "best_of": 3}, "best_of", "not supported"),
        ({"prompt": "x", "suffix": "y"}, "suffix", "not supported"),
        ({"prompt": "x", "logprobs": -1}, "logprobs", "[0, 20]"),
        ({"prompt": "x", "messages": []}, "messages", "unrecognized"),
    ],
)
def test_completion_rejects_bad_fields(fields, param, fragment):
    rejects(lambda **f: parse_completion_request({"model": "m", **f}), param, fragment, **fields)
