"""Validation of OpenAI Responses API bodies (`POST /v1/responses`) into a `ChatRequest`.

A Responses call is a chat completion in other clothes, so it runs (and is recorded in ATDP)
through the same data-proxy path: its input items become chat messages, its flat function
tools become chat tool specs, `instructions` the leading system message and `text.format` the
response format. What it adds is conversation state: `previous_response_id` names a stored
response whose conversation (its input and output) comes before this call's input.

Input items: a string (one user message), messages (`role` user / system / developer /
assistant, content a string or input_text / output_text parts), `function_call` (an
assistant tool call), `function_call_output` (its result) and `reasoning` (the model's
thinking, rendered back as `<think>` text at the start of the assistant turn it precedes).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from serving.common.errors import bad_request
from serving.common.openai_requests import (
    MAX_TOP_LOGPROBS,
    REASONING_EFFORTS,
    ChatRequest,
    Decoding,
    _boolean,
    _check_ignored,
    _integer,
    _max_tokens,
    _model,
    _sampling,
    parse_messages,
    parse_tools,
)
from serving.common.tool_specs import parse_response_format, parse_tool_choice

# Fields that shape the answer or the stored conversation; the rest is accepted and ignored.
_RESPONSES_FIELDS = {
    "model",
    "input",
    "instructions",
    "tools",
    "tool_choice",
    "temperature",
    "top_p",
    "max_output_tokens",
    "stream",
    "store",
    "previous_response_id",
    "text",
    "reasoning",
    "top_logprobs",
    "seed",
    "top_k",
    "stop",
}
_TEXT_PARTS = ("input_text", "output_text", "text", "summary_text", "reasoning_text")


@dataclasses.dataclass(frozen=True)
class ResponsesRequest:
    """A validated Responses body.

    chat: the call to run, without the stored conversation (`input` is its `messages`, after
    `instructions`); previous_response_id: the stored response that comes first; store:
    whether this response is kept for a later `previous_response_id`; echo: the fields a
    Response object repeats back (instructions, tools, tool_choice, text, ...).
    """

    chat: ChatRequest
    input_messages: list[dict[str, Any]]
    instructions: str | None
    previous_response_id: str | None
    store: bool
    echo: dict[str, Any]


def _text_of(content: Any, where: str) -> str:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise bad_request(f"{where}.content must be a string or a list of parts", param=where)
    texts = []
    for index, part in enumerate(content):
        kind = part.get("type") if isinstance(part, Mapping) else None
        if kind not in _TEXT_PARTS or not isinstance(part.get("text"), str):
            raise bad_request(
                f"{where}.content[{index}] has type {kind!r}: only text parts "
                f"({', '.join(_TEXT_PARTS[:2])}) are supported",
                param=where,
            )
        texts.append(part["text"])
    return "".join(texts)


def _string(item: Mapping, name: str, where: str) -> str:
    value = item.get(name)
    if not isinstance(value, str) or (name != "arguments" and not value):
        raise bad_request(f"{where}.{name} must be a non-empty string", param=f"{where}.{name}")
    return value


def input_messages(value: Any) -> list[dict[str, Any]]:
    """Chat messages from Responses `input` (a string or a list of items)."""
    if isinstance(value, str):
        return [{"role": "user", "content": value}]
    if not isinstance(value, list):
        raise bad_request("'input' must be a string or a list of input items", param="input")
    messages: list[dict[str, Any]] = []
    thinking = ""  # reasoning text waiting for the assistant turn it belongs to

    def assistant() -> dict[str, Any]:
        """The assistant message a function call joins: the last one, if nothing followed."""
        nonlocal thinking
        if not messages or messages[-1]["role"] != "assistant" or thinking:
            content = f"<think>{thinking}</think>" if thinking else ""
            messages.append({"role": "assistant", "content": content})
            thinking = ""
        return messages[-1]

    for index, item in enumerate(value):
        where = f"input[{index}]"
        if not isinstance(item, Mapping):
            raise bad_request(f"{where} must be an object", param=where)
        kind = item.get("type", "message")
        if kind == "message":
            role = item.get("role")
            if role not in ("user", "system", "developer", "assistant"):
                raise bad_request(
                    f"{where}.role {role!r} is invalid: user, system, developer or assistant",
                    param=f"{where}.role",
                )
            text = _text_of(item.get("content"), where)
            if role == "assistant" and thinking:
                text, thinking = f"<think>{thinking}</think>{text}", ""
            messages.append({"role": role, "content": text})
        elif kind == "function_call":
            call = {
                "id": _string(item, "call_id", where),
                "type": "function",
                "function": {
                    "name": _string(item, "name", where),
                    "arguments": _string(item, "arguments", where),
                },
            }
            target = assistant()
            target.setdefault("tool_calls", []).append(call)
            if target["content"] == "":
                target["content"] = None
        elif kind == "function_call_output":
            output = item.get("output")
            text = output if isinstance(output, str) else _text_of(output, where)
            call_id = _string(item, "call_id", where)
            messages.append({"role": "tool", "tool_call_id": call_id, "content": text})
        elif kind == "reasoning":
            parts = item.get("content") or item.get("summary") or []
            thinking += _text_of(parts, where)
        else:
            raise bad_request(
                f"{where}.type {kind!r} is not supported: message, function_call, "
                "function_call_output or reasoning",
                param=f"{where}.type",
            )
    return messages


def _tools(value: Any) -> list[dict[str, Any]] | None:
    """Responses function tools are flat ({type, name, parameters}); chat nests `function`."""
    if value is None:
        return None
    if not isinstance(value, list):
        raise bad_request("'tools' must be a list of tools", param="tools")
    chat_tools = []
    for index, tool in enumerate(value):
        if not isinstance(tool, Mapping) or tool.get("type") != "function":
            kind = tool.get("type") if isinstance(tool, Mapping) else type(tool).__name__
            raise bad_request(
                f"tools[{index}].type {kind!r} is not supported: only function tools",
                param=f"tools[{index}]",
            )
        function = {k: v for k, v in tool.items() if k != "type"}
        chat_tools.append({"type": "function", "function": function})
    return parse_tools(chat_tools)


def _reasoning_effort(value: Any) -> str | None:
    if value is None:
        return None
    effort = value.get("effort") if isinstance(value, Mapping) else None
    if not isinstance(value, Mapping) or (effort is not None and effort not in REASONING_EFFORTS):
        raise bad_request(
            f"'reasoning.effort' must be one of {list(REASONING_EFFORTS)}", param="reasoning"
        )
    return effort


def _text_format(value: Any) -> dict[str, Any] | None:
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise bad_request("'text' must be an object", param="text")
    return parse_response_format(value.get("format"), param="text.format")


def parse_responses_request(body: Mapping[str, Any]) -> ResponsesRequest:
    """Validate a Responses body; raises a 400 `ApiError` naming the field."""
    _check_ignored(body)
    ignored = tuple(sorted(name for name in body if name not in _RESPONSES_FIELDS))
    for name in ("background", "conversation"):
        if body.get(name):
            raise bad_request(f"'{name}' is not supported by this server", param=name)
    model = _model(body)
    instructions = body.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        raise bad_request("'instructions' must be a string", param="instructions")
    given = input_messages(body.get("input"))
    previous = body.get("previous_response_id")
    if previous is not None and (not isinstance(previous, str) or not previous):
        raise bad_request(
            "'previous_response_id' must be a response id", param="previous_response_id"
        )
    if not given and previous is None:
        raise bad_request("'input' must not be empty", param="input")
    tools = _tools(body.get("tools"))
    tool_choice = parse_tool_choice(body.get("tool_choice"), tools)
    top_logprobs = _integer(body, "top_logprobs", 0, 0, MAX_TOP_LOGPROBS)
    sampling = _sampling(body)
    sampling["max_tokens"] = _max_tokens(body, "max_output_tokens")
    store = body.get("store", True)
    if not isinstance(store, bool):
        raise bad_request("'store' must be a boolean", param="store")
    system = [{"role": "system", "content": instructions}] if instructions else []
    # The stored conversation goes between the instructions and `given` (the gateway adds it);
    # validated here on its own so a bad item is named by its index in `input`.
    # With a previous response, `input` may answer its tool calls: checked with the history.
    messages = parse_messages(system + given) if previous is None else system + given
    chat = ChatRequest(
        model=model,
        messages=messages,
        decoding=Decoding(**sampling, logprobs=top_logprobs > 0, top_logprobs=top_logprobs),
        tools=tools,
        tool_choice=tool_choice,
        stream=_boolean(body, "stream"),
        include_usage=True,
        response_format=_text_format(body.get("text")),
        reasoning_effort=_reasoning_effort(body.get("reasoning")),
        ignored=ignored,
        endpoint="responses",
    )
    echo = {
        "instructions": instructions,
        "tools": body.get("tools") or [],
        "tool_choice": body.get("tool_choice", "auto"),
        "text": body.get("text") or {"format": {"type": "text"}},
        "temperature": chat.decoding.temperature,
        "top_p": chat.decoding.top_p,
        "max_output_tokens": body.get("max_output_tokens"),
        "parallel_tool_calls": body.get("parallel_tool_calls", True),
        "metadata": body.get("metadata") or {},
        "reasoning": body.get("reasoning"),
    }
    return ResponsesRequest(chat, given, instructions, previous, store, echo)


def with_history(request: ResponsesRequest, history: Sequence[Mapping[str, Any]]) -> ChatRequest:
    """The chat call with a stored conversation (`previous_response_id`'s) before the input;
    the instructions of earlier responses are not carried over (OpenAI's rule)."""
    system = [{"role": "system", "content": request.instructions}] if request.instructions else []
    messages = parse_messages(system + list(history) + request.input_messages)
    return dataclasses.replace(request.chat, messages=messages)
