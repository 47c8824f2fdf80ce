"""ChatML rendering with Qwen-style tool calls, as pure string functions.

The format is the one Qwen2.5 / Qwen3 chat models are trained on, so a real checkpoint sees the
prompts it expects and the serving gateway can expose OpenAI tools through it:

    <|im_start|>system
    {system text}

    # Tools
    ...
    <tools>
    {"type": "function", "function": {...}}
    </tools>
    ...<|im_end|>
    <|im_start|>user
    {text}<|im_end|>
    <|im_start|>assistant
    {text}
    <tool_call>
    {"name": "f", "arguments": {...}}
    </tool_call><|im_end|>
    <|im_start|>user
    <tool_response>
    {tool output}
    </tool_response><|im_end|>
    <|im_start|>assistant

Consecutive `tool` messages share one user turn. A system message after the first is rendered in
place as its own system turn (as Qwen3's template does; agents add instructions mid-conversation). `CHATML_JINJA_TEMPLATE` is the same template in
Jinja, written into saved `tokenizer_config.json` files so `transformers` renders identically.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
ROLES = ("system", "user", "assistant", "tool")

_TOOLS_INTRO = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>"
)
_TOOLS_OUTRO = (
    "\n</tools>\n\nFor each function call, return a json object with function name and "
    "arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n"
    '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
)


def template_text() -> str:
    """Every fixed piece of text the template itself writes (roles, the tools preamble), so a
    word-level vocabulary can include its words."""
    return "\n".join([*ROLES, _TOOLS_INTRO, _TOOLS_OUTRO])


def _json(value: Any) -> str:
    # Same separators and unicode handling as transformers' Jinja `tojson` filter.
    return json.dumps(value, ensure_ascii=False)


def _text_content(message: Mapping[str, Any], index: int) -> str:
    """The text of one message; OpenAI content-part lists are joined, other parts refused."""
    content = message.get("content")
    if content is None:
        if message["role"] == "assistant" and message.get("tool_calls"):
            return ""
        raise ValueError(f"message {index} ({message['role']}) has no 'content'")
    if isinstance(content, str):
        return content
    if isinstance(content, Sequence):
        texts = []
        for part_index, part in enumerate(content):
            if not isinstance(part, Mapping) or part.get("type") != "text":
                kind = part.get("type") if isinstance(part, Mapping) else type(part).__name__
                raise ValueError(
                    f"message {index} content part {part_index} has type {kind!r}; "
                    "only text parts are supported"
                )
            texts.append(str(part.get("text", "")))
        return "".join(texts)
    raise TypeError(
        f"message {index} content is {type(content).__name__}; expected str, a list of "
        "text parts, or None (assistant turns with tool_calls)"
    )


def normalize_tools(tools: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """OpenAI tool specs, accepting bare function specs `{name, description, parameters}` too."""
    normalized = []
    for index, tool in enumerate(tools):
        if not isinstance(tool, Mapping):
            raise TypeError(f"tool {index} is {type(tool).__name__}; expected a dict")
        spec = dict(tool) if "function" in tool else {"type": "function", "function": dict(tool)}
        function = spec.get("function")
        if not isinstance(function, Mapping) or not isinstance(function.get("name"), str):
            raise ValueError(f"tool {index} has no function name: {tool!r}")
        normalized.append(spec)
    return normalized


def _render_tool_call(call: Mapping[str, Any], message_index: int) -> str:
    function = call.get("function", call)
    name = function.get("name") if isinstance(function, Mapping) else None
    if not isinstance(name, str):
        raise ValueError(f"message {message_index} has a tool call without a name: {call!r}")
    arguments = function.get("arguments", {})
    # OpenAI sends arguments as a JSON string: keep it verbatim, it is what the model emitted.
    rendered = arguments if isinstance(arguments, str) else _json(arguments)
    return f'<tool_call>\n{{"name": {_json(name)}, "arguments": {rendered}}}\n</tool_call>'


def validate_messages(messages: Sequence[Mapping[str, Any]]) -> None:
    """Raise a ValueError / TypeError naming the first malformed message."""
    if isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence):
        raise TypeError(f"messages must be a list of dicts, got {type(messages).__name__}")
    for index, message in enumerate(messages):
        if not isinstance(message, Mapping):
            raise TypeError(
                f"message {index} is {type(message).__name__}; expected a dict with "
                "'role' and 'content'"
            )
        role = message.get("role")
        if role not in ROLES:
            raise ValueError(f"message {index} has role {role!r}; expected one of {ROLES}")
        _text_content(message, index)


def render_chatml(
    messages: Sequence[Mapping[str, Any]],
    *,
    add_generation_prompt: bool = True,
    tools: Sequence[Mapping[str, Any]] | None = None,
) -> str:
    """Render OpenAI-style messages as ChatML text (see the module docstring for the layout).

    Args:
      messages: dicts with `role` in ROLES and `content` (str, text parts, or None for an
        assistant turn that only has `tool_calls`); assistant turns may carry OpenAI
        `tool_calls` (`{"function": {"name", "arguments"}}`, arguments a dict or JSON string).
      add_generation_prompt: end with an open assistant turn for the model to continue.
      tools: OpenAI tool specs; listed in the system message when given.
    """
    validate_messages(messages)
    parts: list[str] = []
    body = list(enumerate(messages))
    if tools:
        system = ""
        if body and messages[0]["role"] == "system":
            system = _text_content(messages[0], 0) + "\n\n"
            body = body[1:]
        listed = "".join("\n" + _json(tool) for tool in normalize_tools(tools))
        parts.append(f"{IM_START}system\n{system}{_TOOLS_INTRO}{listed}{_TOOLS_OUTRO}{IM_END}\n")
    for position, (index, message) in enumerate(body):
        role, text = message["role"], _text_content(message, index)
        if role == "tool":
            if position == 0 or body[position - 1][1]["role"] != "tool":
                parts.append(f"{IM_START}user")
            parts.append(f"\n<tool_response>\n{text}\n</tool_response>")
            if position == len(body) - 1 or body[position + 1][1]["role"] != "tool":
                parts.append(f"{IM_END}\n")
        elif role == "assistant" and message.get("tool_calls"):
            parts.append(f"{IM_START}assistant")
            if text:
                parts.append("\n" + text)
            for call in message["tool_calls"]:
                parts.append("\n" + _render_tool_call(call, index))
            parts.append(f"{IM_END}\n")
        else:
            parts.append(f"{IM_START}{role}\n{text}{IM_END}\n")
    if add_generation_prompt:
        parts.append(f"{IM_START}assistant\n")
    return "".join(parts)


# The same layout for transformers / vLLM users of a saved tokenizer (string content only).
CHATML_JINJA_TEMPLATE = (
    "{%- if tools %}{{- '<|im_start|>system\\n' }}"
    "{%- if messages[0].role == 'system' %}{{- messages[0].content + '\\n\\n' }}{%- endif %}"
    "{{- " + _json(_TOOLS_INTRO) + " }}"
    "{%- for tool in tools %}{{- '\\n' }}{{- tool | tojson }}{%- endfor %}"
    "{{- " + _json(_TOOLS_OUTRO + IM_END + "\n") + " }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if tools and loop.first and message.role == 'system' %}"
    "{%- elif message.role == 'tool' %}"
    "{%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}"
    "{{- '<|im_start|>user' }}{%- endif %}"
    "{{- '\\n<tool_response>\\n' + message.content + '\\n</tool_response>' }}"
    "{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}"
    "{{- '<|im_end|>\\n' }}{%- endif %}"
    "{%- elif message.role == 'assistant' and message.tool_calls %}"
    "{{- '<|im_start|>assistant' }}"
    "{%- if message.content %}{{- '\\n' + message.content }}{%- endif %}"
    "{%- for call in message.tool_calls %}"
    "{%- if call.function is defined %}{%- set call = call.function %}{%- endif %}"
    "{{- '\\n<tool_call>\\n{\"name\": ' + (call.name | tojson) + ', \"arguments\": ' }}"
    "{%- if call.arguments is string %}{{- call.arguments }}"
    "{%- else %}{{- call.arguments | tojson }}{%- endif %}"
    "{{- '}\\n</tool_call>' }}"
    "{%- endfor %}{{- '<|im_end|>\\n' }}"
    "{%- else %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
