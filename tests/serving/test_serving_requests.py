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
        ({"max_tokens": 2**40}, "max_tokens", "largest accepted value is 2147483647"),
        ({"max_completion_tokens": 2**31}, "max_completion_tokens", "2147483647"),
        ({"top_k": 2**40}, "top_k", "[-1, 2147483647]"),
        ({"n": 9}, "n", "[1, 8]"),
        ({"n": 0}, "n", "[1, 8]"),
        ({"presence_penalty": 3}, "presence_penalty", "[-2.0, 2.0]"),
        ({"frequency_penalty": "x"}, "frequency_penalty", "number"),
        ({"logit_bias": {"a": 5}}, "logit_bias", "token ids"),
        ({"logit_bias": {"1": 500}}, "1", "[-100.0, 100.0]"),
        ({"parallel_tool_calls": "yes"}, "parallel_tool_calls", "boolean"),
        ({"reasoning_effort": "huge"}, "reasoning_effort", "'xhigh', 'max'"),
        ({"tool_choice": "required"}, "tool_choice", "no 'tools' were given"),
        ({"tool_choice": "sometimes"}, "tool_choice", "'required'"),
        ({"tool_choice": 3}, "tool_choice", "must be 'auto'"),
        ({"response_format": {"type": "xml"}}, "response_format", "'json_schema'"),
        (
            {"response_format": {"type": "json_schema", "json_schema": {"name": "a b"}}},
            "response_format.json_schema.name",
            "[A-Za-z0-9_-]",
        ),
        ({"stream_options": {"include_usage": True}}, "stream_options", "stream=true"),
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
        ({"prompt": "x", "n": 20}, "n", "[1, 8]"),
    ],
)
def test_completion_rejects_bad_fields(fields, param, fragment):
    rejects(lambda **f: parse_completion_request({"model": "m", **f}), param, fragment, **fields)


WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}


@pytest.mark.parametrize("echoed", [{"content": None}, {}])
def test_an_echoed_reasoning_only_reply_is_accepted(echoed):
    """A reply that was all reasoning has `content: null`; the agent sends it back as it got
    it (or without the null field): an empty assistant turn, not a 400."""
    messages = [
        {"role": "user", "content": "think"},
        {"role": "assistant", **echoed},
        {"role": "user", "content": "and?"},
    ]
    request = parse_chat_request({"model": "m", "messages": messages})
    assert request.messages[1] == {"role": "assistant", "content": ""}
    with pytest.raises(ApiError, match="no 'content'"):  # only assistant turns may be empty
        parse_chat_request({"model": "m", "messages": [{"role": "user", "content": None}]})


def test_what_agents_send_is_accepted():
    messages = [
        {"role": "developer", "content": "You are terse."},
        {"role": "system", "content": "Tools are slow."},
        {"role": "user", "content": "hi"},
        {"role": "system", "content": "Answer in French."},
    ]
    request = parse_chat_request(
        {
            "model": "m",
            "messages": messages,
            "reasoning_effort": "xhigh",
            "n": 3,
            "max_tokens": 2**31 - 1,
            "presence_penalty": 0.5,
            "frequency_penalty": -1,
            "logit_bias": {"50256": -100},
            "user": "u",
            "parallel_tool_calls": False,
            "x_vendor_extension": {"anything": [1, 2]},
            "tools": [WEATHER],
            "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "out", "schema": {"type": "object"}, "strict": True},
            },
        }
    )
    assert [m["role"] for m in request.messages] == ["system", "system", "user", "system"]
    assert request.reasoning_effort == "xhigh" and request.n == 3
    assert request.decoding.max_tokens == 2**31 - 1  # clamped to the context by the proxy
    assert request.ignored == (
        "frequency_penalty",
        "logit_bias",
        "parallel_tool_calls",
        "presence_penalty",
        "user",
        "x_vendor_extension",
    )
    assert request.tool_choice == {"name": "get_weather"}
    assert request.response_format == {
        "type": "json_schema",
        "name": "out",
        "schema": {"type": "object"},
        "strict": True,
    }
    assert ChatRequest.from_json(request.to_json()) == request
    assert chat(response_format={"type": "json_object"}).response_format == {"type": "json_object"}
    assert chat(response_format={"type": "text"}).response_format is None


def tool(name="f", parameters=None, **fields):
    function = {"name": name, **fields}
    if parameters is not None:
        function["parameters"] = parameters
    return {"type": "function", "function": function}


@pytest.mark.parametrize(
    ("tools", "param", "fragment"),
    [
        ([tool(parameters={"type": "string"})], "tools[0].function.parameters", '"type": "object"'),
        ([tool(parameters=["city"])], "tools[0].function.parameters", "got list"),
        (
            [tool(parameters={"type": "object", "properties": {"a": {"type": "str"}}})],
            "tools[0].function.parameters.properties.a",
            "not a JSON Schema type",
        ),
        (
            [tool(parameters={"type": "object", "required": "a"})],
            "tools[0].function.parameters",
            "list of property names",
        ),
        ([tool(name="get weather")], "tools[0].function.name", "1 to 64 characters"),
        ([tool(name="x" * 65)], "tools[0].function.name", "1 to 64 characters"),
        ([tool(name="")], "tools[0].function.name", "1 to 64"),
        ([tool(), tool()], "tools[1].function.name", "already used by tools[0]"),
        ([{"type": "web_search"}], "tools", "no function name"),
        ([{"type": "custom", "function": {"name": "f"}}], "tools[0]", "only function tools"),
        ([tool(description=3)], "tools[0]", "description must be a string"),
        ([tool(str(i)) for i in range(129)], "tools", "at most 128"),
    ],
)
def test_bad_tools_are_refused_naming_the_limit(tools, param, fragment):
    rejects(chat, param, fragment, tools=tools)


def test_good_tool_schemas_pass():
    nested = {
        "type": "object",
        "properties": {
            "when": {"anyOf": [{"type": "string"}, {"type": "null"}]},
            "items": {"type": "array", "items": {"type": ["integer", "number"]}},
        },
        "required": ["when"],
        "additionalProperties": False,
    }
    request = chat(tools=[tool("a-b_C9", nested), tool("empty", {}), tool("none")])
    assert [t["function"]["name"] for t in request.tools] == ["a-b_C9", "empty", "none"]
    error = rejects(
        chat,
        "tool_choice",
        "not among the tools",
        tools=[tool()],
        tool_choice={"type": "function", "function": {"name": "g"}},
    )
    assert "['f']" in error.message


def test_tool_history_ids_must_match_a_call():
    call = {"id": "call_a", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    history = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_a", "content": "ok"},
    ]
    assert len(chat(messages=history).messages) == 3
    wrong = [*history[:2], {"role": "tool", "tool_call_id": "call_b", "content": "ok"}]
    rejects(chat, "messages[2].tool_call_id", "'call_b' answers no tool call", messages=wrong)
    no_id = [
        history[0],
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"function": {"name": "f", "arguments": "{}"}}],
        },
    ]
    rejects(chat, "messages[1].tool_calls[0].id", "needs an 'id'", messages=no_id)
