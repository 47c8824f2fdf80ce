"""Tool-call parsing: well-formed calls, mixed text, and every malformed shape reported."""

import json

from sao_jax.tokenizers import ToolCall, parse_tool_calls, render_chatml


def test_round_trip_through_the_chat_template():
    arguments = {"city": "Zürich", "days": 3, "units": ["C"]}
    message = {
        "role": "assistant",
        "content": "Let me check.",
        "tool_calls": [{"function": {"name": "forecast", "arguments": arguments}}],
    }
    text = render_chatml([message], add_generation_prompt=False)
    reply = text.removeprefix("<|im_start|>assistant\n").removesuffix("<|im_end|>\n")
    parsed = parse_tool_calls(reply)
    assert parsed.tool_calls == [ToolCall("forecast", arguments)]
    assert parsed.content == "Let me check."
    assert parsed.errors == []


def test_several_calls_keep_order_and_string_arguments_are_decoded():
    text = (
        '<tool_call>{"name": "a", "arguments": {"x": 1}}</tool_call> and '
        '<tool_call>\n{"name": "b", "arguments": "{\\"y\\": 2}"}\n</tool_call>'
    )
    parsed = parse_tool_calls(text)
    assert [(c.name, c.arguments) for c in parsed.tool_calls] == [("a", {"x": 1}), ("b", {"y": 2})]
    assert parsed.content == "and"


def test_to_openai_encodes_arguments_as_json_string():
    entry = ToolCall("f", {"k": [1, 2]}).to_openai("call_0")
    assert entry["id"] == "call_0" and entry["type"] == "function"
    assert json.loads(entry["function"]["arguments"]) == {"k": [1, 2]}


def test_text_without_calls_is_untouched():
    parsed = parse_tool_calls("<think>hmm</think><action>go to cabinet 2</action>")
    assert parsed.tool_calls == [] and parsed.errors == []
    assert parsed.content == "<think>hmm</think><action>go to cabinet 2</action>"


def test_malformed_blocks_are_reported_not_raised():
    text = (
        "<tool_call>{not json}</tool_call>"
        '<tool_call>["a list"]</tool_call>'
        '<tool_call>{"arguments": {}}</tool_call>'
        '<tool_call>{"name": "ok", "arguments": 5}</tool_call>'
        '<tool_call>{"name": "good"}</tool_call>'
        'tail <tool_call>{"name": "cut'
    )
    parsed = parse_tool_calls(text)
    assert parsed.tool_calls == [ToolCall("good", {})]
    assert len(parsed.errors) == 5
    assert "tool call 0" in parsed.errors[0] and "{not json}" in parsed.errors[0]
    assert "expected a JSON object" in parsed.errors[1]
    assert "missing 'name'" in parsed.errors[2]
    assert "'arguments' is int" in parsed.errors[3]
    assert parsed.errors[4].startswith("unterminated tool call")
    assert parsed.content == "tail"
