"""ChatML rendering: exact layout, Qwen-style tools, errors, and parity with transformers."""

import json

import pytest

from sao_jax.tokenizers import CHATML_JINJA_TEMPLATE, render_chatml

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}

TOOL_CONVERSATION = [
    {"role": "system", "content": "You help."},
    {"role": "user", "content": "Weather in Paris and Zürich?"},
    {
        "role": "assistant",
        "content": "Checking.",
        "tool_calls": [
            {
                "id": "a",
                "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
            },
            {
                "id": "b",
                "type": "function",
                "function": {"name": "get_weather", "arguments": {"city": "Zürich"}},
            },
        ],
    },
    {"role": "tool", "tool_call_id": "a", "content": "18 C"},
    {"role": "tool", "tool_call_id": "b", "content": "12 C"},
]


def test_plain_conversation_layout():
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "<think>x</think>"},
        {"role": "assistant", "content": "<action>look</action>"},
    ]
    expected = (
        "<|im_start|>system\nBe brief.<|im_end|>\n"
        "<|im_start|>user\n<think>x</think><|im_end|>\n"
        "<|im_start|>assistant\n<action>look</action><|im_end|>\n"
    )
    assert render_chatml(messages, add_generation_prompt=False) == expected
    assert render_chatml(messages) == expected + "<|im_start|>assistant\n"


def test_tools_listed_in_system_and_calls_and_responses_rendered_qwen_style():
    text = render_chatml(TOOL_CONVERSATION, tools=[WEATHER_TOOL])
    system, rest = text.split("<|im_end|>\n", 1)
    assert system.startswith("<|im_start|>system\nYou help.\n\n# Tools\n")
    assert "\n<tools>\n" + json.dumps(WEATHER_TOOL, ensure_ascii=False) + "\n</tools>" in system
    assert rest.count("<|im_start|>system") == 0  # the system message is not repeated
    assert (
        "<|im_start|>assistant\nChecking.\n<tool_call>\n"
        '{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n<tool_call>\n'
        '{"name": "get_weather", "arguments": {"city": "Zürich"}}\n</tool_call><|im_end|>\n'
    ) in rest
    # consecutive tool results share one user turn
    assert rest.endswith(
        "<|im_start|>user\n<tool_response>\n18 C\n</tool_response>\n<tool_response>\n12 C\n"
        "</tool_response><|im_end|>\n<|im_start|>assistant\n"
    )


def test_bare_function_spec_is_wrapped_and_tools_without_system_message():
    bare = WEATHER_TOOL["function"]
    text = render_chatml([{"role": "user", "content": "hi"}], tools=[bare])
    assert text.startswith("<|im_start|>system\n# Tools\n")
    assert json.dumps(WEATHER_TOOL, ensure_ascii=False) in text


def test_text_parts_are_joined():
    parts = [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]
    assert "user\nab<|im_end|>" in render_chatml([{"role": "user", "content": parts}])


@pytest.mark.parametrize(
    ("messages", "error", "match"),
    [
        ("hello", TypeError, "list of dicts"),
        (["hello"], TypeError, "message 0 is str"),
        ([{"role": "robot", "content": "x"}], ValueError, "role 'robot'"),
        ([{"role": "user"}], ValueError, "message 0 .user. has no 'content'"),
        ([{"role": "user", "content": [{"type": "image_url"}]}], ValueError, "'image_url'"),
        (
            [{"role": "assistant", "content": None, "tool_calls": [{"function": {}}]}],
            ValueError,
            "tool call without a name",
        ),
    ],
)
def test_malformed_messages_are_named(messages, error, match):
    with pytest.raises(error, match=match):
        render_chatml(messages)


def test_bad_tool_spec_is_named():
    with pytest.raises(ValueError, match="tool 0 has no function name"):
        render_chatml([{"role": "user", "content": "x"}], tools=[{"description": "nameless"}])


LATE_SYSTEM = {"role": "system", "content": "Answer in French."}


def test_a_later_system_message_is_rendered_in_place():
    messages = [*TOOL_CONVERSATION[:2], LATE_SYSTEM]
    text = render_chatml(messages, tools=[WEATHER_TOOL])
    assert text.count("<|im_start|>system\n") == 2
    assert text.endswith("<|im_start|>system\nAnswer in French.<|im_end|>\n<|im_start|>assistant\n")


@pytest.mark.parametrize("with_tools", [False, True])
def test_jinja_template_matches_python_renderer_in_transformers(with_tools):
    from transformers.utils.chat_template_utils import render_jinja_template

    tools = [WEATHER_TOOL] if with_tools else None
    conversation = TOOL_CONVERSATION if with_tools else TOOL_CONVERSATION[:2]
    conversation = [*conversation, LATE_SYSTEM]
    rendered, _ = render_jinja_template(
        conversations=[conversation],
        tools=tools,
        chat_template=CHATML_JINJA_TEMPLATE,
        add_generation_prompt=True,
    )
    assert rendered[0] == render_chatml(conversation, tools=tools)
