"""Parse the model's Qwen-style tool calls out of generated text.

A reply may mix free text and any number of blocks

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

Generated text is untrusted: a block whose JSON is broken, lacks a name, or is cut off by the
token limit is reported in `ParsedToolCalls.errors` with its raw text, never raised, so the
caller (the serving gateway, a reward function) decides what a malformed call costs.
"""

from __future__ import annotations

import dataclasses
import json
import re
from typing import Any

TOOL_CALL_OPEN = "<tool_call>"
TOOL_CALL_CLOSE = "</tool_call>"
_BLOCK = re.compile(re.escape(TOOL_CALL_OPEN) + r"(.*?)" + re.escape(TOOL_CALL_CLOSE), re.DOTALL)


@dataclasses.dataclass(frozen=True)
class ToolCall:
    """One parsed call: the function name and its decoded JSON arguments."""

    name: str
    arguments: dict[str, Any]

    def to_openai(self, call_id: str) -> dict[str, Any]:
        """The OpenAI chat-completions `tool_calls` entry (arguments as a JSON string)."""
        return {
            "id": call_id,
            "type": "function",
            "function": {"name": self.name, "arguments": json.dumps(self.arguments)},
        }


@dataclasses.dataclass(frozen=True)
class ParsedToolCalls:
    """`content`: the text outside tool-call blocks (stripped); `errors`: one line per bad block."""

    content: str
    tool_calls: list[ToolCall]
    errors: list[str]


def _parse_block(body: str) -> ToolCall:
    payload = json.loads(body)
    if not isinstance(payload, dict):
        raise ValueError(f"expected a JSON object, got {type(payload).__name__}")
    name = payload.get("name")
    if not isinstance(name, str) or not name:
        raise ValueError("missing 'name'")
    arguments = payload.get("arguments", {})
    if isinstance(arguments, str):  # some models double-encode the arguments
        arguments = json.loads(arguments) if arguments.strip() else {}
    if not isinstance(arguments, dict):
        raise ValueError(f"'arguments' is {type(arguments).__name__}, expected an object")
    return ToolCall(name=name, arguments=arguments)


def parse_tool_calls(text: str) -> ParsedToolCalls:
    """Split generated text into free content and the tool calls it makes, in order."""
    calls: list[ToolCall] = []
    errors: list[str] = []
    for match in _BLOCK.finditer(text):
        body = match.group(1).strip()
        try:
            calls.append(_parse_block(body))
        except ValueError as error:  # json.JSONDecodeError is a ValueError
            errors.append(f"tool call {len(calls) + len(errors)}: {error}: {body!r}")
    remainder = _BLOCK.sub("", text)
    cut = remainder.find(TOOL_CALL_OPEN)
    if cut >= 0:  # generation stopped inside a block
        errors.append(f"unterminated tool call: {remainder[cut:]!r}")
        remainder = remainder[:cut]
    return ParsedToolCalls(content=remainder.strip(), tool_calls=calls, errors=errors)
