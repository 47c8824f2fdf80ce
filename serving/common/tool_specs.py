"""Strict validation of what a request says about tools and structured output.

Tool specs, `tool_choice`, `response_format` and the tool-call ids of the history are checked
before anything is rendered or recorded: an invalid schema stored as training data would teach
the policy a tool that cannot exist. Every problem is a 400 naming the field and the real limit
(OpenAI's: names `[A-Za-z0-9_-]{1,64}`, at most 128 tools, `parameters` a JSON Schema of
`"type": "object"`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from serving.common.errors import bad_request

MAX_TOOLS = 128
NAME_PATTERN = re.compile(r"[A-Za-z0-9_-]{1,64}")
NAME_RULE = "[A-Za-z0-9_-]{1,64}: 1 to 64 characters of a-z, A-Z, 0-9, '_' and '-'"
_JSON_TYPES = {"object", "array", "string", "number", "integer", "boolean", "null"}
# Keywords whose value is one schema, a list of schemas, or a map of name -> schema.
_ONE = ("items", "additionalProperties", "not", "contains", "propertyNames", "if", "then", "else")
_MANY = ("anyOf", "oneOf", "allOf", "prefixItems")
_MAP = ("properties", "$defs", "definitions", "patternProperties")


def check_name(name: Any, param: str, what: str) -> str:
    if not isinstance(name, str) or NAME_PATTERN.fullmatch(name) is None:
        raise bad_request(
            f"{what} name {name!r} is invalid: it must match {NAME_RULE}", param=param
        )
    return name


def check_schema(schema: Any, param: str, depth: int = 0) -> None:
    """A structural JSON Schema check: schemas are objects (or booleans), `type` names JSON
    types, `required` lists strings, and every sub-schema is checked the same way."""
    if isinstance(schema, bool):
        return
    if not isinstance(schema, Mapping):
        raise bad_request(f"{param} must be a JSON Schema object", param=param)
    kind = schema.get("type")
    kinds = kind if isinstance(kind, list) else [kind] if kind is not None else []
    for k in kinds:
        if k not in _JSON_TYPES:
            raise bad_request(
                f"{param}.type {k!r} is not a JSON Schema type (one of {sorted(_JSON_TYPES)})",
                param=param,
            )
    required = schema.get("required")
    if required is not None and (
        not isinstance(required, list) or not all(isinstance(r, str) for r in required)
    ):
        raise bad_request(f"{param}.required must be a list of property names", param=param)
    for key in _ONE:
        if key in schema:
            check_schema(schema[key], f"{param}.{key}", depth + 1)
    for key in _MANY:
        if key in schema:
            value = schema[key]
            if not isinstance(value, list):
                raise bad_request(f"{param}.{key} must be a list of schemas", param=param)
            for i, sub in enumerate(value):
                check_schema(sub, f"{param}.{key}[{i}]", depth + 1)
    for key in _MAP:
        if key in schema:
            value = schema[key]
            if not isinstance(value, Mapping):
                raise bad_request(f"{param}.{key} must be an object of schemas", param=param)
            for name, sub in value.items():
                check_schema(sub, f"{param}.{key}.{name}", depth + 1)


def check_parameters(parameters: Any, param: str) -> None:
    """A function's `parameters`: absent, {} (no arguments) or an object schema."""
    if parameters is None or parameters == {}:
        return
    if not isinstance(parameters, Mapping):
        raise bad_request(
            f'{param} must be a JSON Schema object with "type": "object", got '
            f"{type(parameters).__name__}",
            param=param,
        )
    if parameters.get("type") != "object":
        raise bad_request(
            f'{param} must be a JSON Schema of "type": "object" (the arguments are a JSON '
            f"object), got type {parameters.get('type')!r}",
            param=param,
        )
    check_schema(parameters, param)


def check_tools(tools: Sequence[Mapping[str, Any]], param: str = "tools") -> None:
    """Normalized OpenAI tool specs (`{"type": "function", "function": {...}}`)."""
    if len(tools) > MAX_TOOLS:
        raise bad_request(f"'{param}' has {len(tools)} tools; at most {MAX_TOOLS}", param=param)
    seen: dict[str, int] = {}
    for index, tool in enumerate(tools):
        where = f"{param}[{index}]"
        if tool.get("type", "function") != "function":
            raise bad_request(
                f"{where}.type {tool.get('type')!r} is not supported: only function tools",
                param=where,
            )
        function = tool["function"]
        name = check_name(function.get("name"), f"{where}.function.name", "function")
        if name in seen:
            raise bad_request(
                f"{where}: the function name {name!r} is already used by {param}[{seen[name]}]; "
                "tool names must be unique",
                param=f"{where}.function.name",
            )
        seen[name] = index
        description = function.get("description")
        if description is not None and not isinstance(description, str):
            raise bad_request(f"{where}.function.description must be a string", param=where)
        strict = function.get("strict")
        if strict is not None and not isinstance(strict, bool):
            raise bad_request(f"{where}.function.strict must be a boolean", param=where)
        check_parameters(function.get("parameters"), f"{where}.function.parameters")


def parse_tool_choice(value: Any, tools: Sequence[Mapping[str, Any]] | None) -> str | dict:
    """ "auto" | "none" | "required" | {"name": function}. A named function must be one of
    `tools`; forcing a call needs tools."""
    if value is None:
        return "auto"
    if isinstance(value, str):
        if value not in ("auto", "none", "required"):
            raise bad_request(
                f"'tool_choice'={value!r} is invalid: use 'auto', 'none', 'required' or "
                "{'type': 'function', 'function': {'name': ...}}",
                param="tool_choice",
            )
        choice: str | dict = value
    elif isinstance(value, Mapping) and value.get("type") == "function":
        function = value.get("function", value)  # Responses API: {"type", "name"}
        name = function.get("name") if isinstance(function, Mapping) else None
        check_name(name, "tool_choice", "tool_choice function")
        choice = {"name": name}
    else:
        raise bad_request(
            "'tool_choice' must be 'auto', 'none', 'required' or "
            "{'type': 'function', 'function': {'name': ...}}",
            param="tool_choice",
        )
    if choice in ("auto", "none"):
        return choice
    names = [t["function"]["name"] for t in tools or ()]
    if not names:
        raise bad_request(
            f"'tool_choice' {value!r} forces a tool call but no 'tools' were given",
            param="tool_choice",
        )
    if isinstance(choice, dict) and choice["name"] not in names:
        raise bad_request(
            f"'tool_choice' names the function {choice['name']!r}, which is not among the "
            f"tools {names}",
            param="tool_choice",
        )
    return choice


def parse_response_format(value: Any, param: str = "response_format") -> dict[str, Any] | None:
    """None (free text) | {"type": "json_object"} | {"type": "json_schema", "name", "schema",
    "strict"}; accepts Chat's {"type": "json_schema", "json_schema": {...}} and the Responses
    API's flat {"type": "json_schema", "name", "schema"}."""
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise bad_request(f"'{param}' must be an object with a 'type'", param=param)
    kind = value.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return {"type": "json_object"}
    if kind != "json_schema":
        raise bad_request(
            f"'{param}.type' {kind!r} is invalid: use 'text', 'json_object' or 'json_schema'",
            param=param,
        )
    spec = value.get("json_schema", value)
    if not isinstance(spec, Mapping):
        raise bad_request(f"'{param}.json_schema' must be an object", param=param)
    name = check_name(spec.get("name"), f"{param}.json_schema.name", "json_schema")
    schema = spec.get("schema", {})
    if not isinstance(schema, Mapping):
        raise bad_request(f"'{param}.json_schema.schema' must be a JSON Schema object", param=param)
    check_schema(schema, f"{param}.json_schema.schema")
    strict = spec.get("strict")
    if strict is not None and not isinstance(strict, bool):
        raise bad_request(f"'{param}.json_schema.strict' must be a boolean", param=param)
    return {"type": "json_schema", "name": name, "schema": dict(schema), "strict": bool(strict)}


def check_tool_call_ids(messages: Sequence[Mapping[str, Any]]) -> None:
    """Assistant tool calls carry a string id; a tool message answers one of them."""
    known: set[str] = set()
    for index, message in enumerate(messages):
        for call_index, call in enumerate(message.get("tool_calls") or ()):
            call_id = call.get("id") if isinstance(call, Mapping) else None
            if not isinstance(call_id, str) or not call_id:
                raise bad_request(
                    f"messages[{index}].tool_calls[{call_index}] needs an 'id' (a non-empty "
                    "string the tool message answering it repeats)",
                    param=f"messages[{index}].tool_calls[{call_index}].id",
                )
            known.add(call_id)
        if message.get("role") == "tool" and message["tool_call_id"] not in known:
            raise bad_request(
                f"messages[{index}]: tool_call_id {message['tool_call_id']!r} answers no tool "
                "call of an earlier assistant message",
                param=f"messages[{index}].tool_call_id",
            )
