"""What is new in a conversation since the session's last call.

Agents resend the whole conversation on every call. The proxy keeps, per session, the messages
it has already recorded (plus the reply it generated) in a canonical form that ignores wire
details (content as a string or text parts, `None` vs "", tool-call ids, JSON spacing in tool
arguments), and records only the messages past the longest common prefix. A conversation that
does not extend what was recorded (the agent edited or truncated its history) is flagged
`rewritten`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

Canonical = tuple


def message_text(message: Mapping[str, Any]) -> str:
    """The text of a message's content (a string, text parts, or None)."""
    content = message.get("content")
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return "".join(str(part.get("text", "")) for part in content if isinstance(part, Mapping))


def tool_call_arguments(call: Mapping[str, Any]) -> dict[str, Any] | str:
    """Decoded arguments of an OpenAI tool call (the raw string if it is not a JSON object)."""
    function = call.get("function", call)
    arguments = function.get("arguments", {}) if isinstance(function, Mapping) else {}
    if isinstance(arguments, str):
        try:
            decoded = json.loads(arguments) if arguments.strip() else {}
        except json.JSONDecodeError:
            return arguments
        return decoded if isinstance(decoded, dict) else arguments
    return dict(arguments)


def _canonical_call(call: Mapping[str, Any]) -> tuple[str, str]:
    function = call.get("function", call)
    name = function.get("name", "") if isinstance(function, Mapping) else ""
    return name, json.dumps(tool_call_arguments(call), sort_keys=True)


def canonical(message: Mapping[str, Any]) -> Canonical:
    """Comparable form of one message: (role, text, tool calls, tool_call_id)."""
    calls = tuple(_canonical_call(c) for c in message.get("tool_calls") or ())
    tool_call_id = message.get("tool_call_id") if message.get("role") == "tool" else None
    return (message.get("role"), message_text(message), calls, tool_call_id)


def new_messages(
    known: Sequence[Canonical], messages: Sequence[Mapping[str, Any]]
) -> tuple[int, bool]:
    """(index of the first message not yet recorded, whether the history was rewritten)."""
    incoming = [canonical(m) for m in messages]
    common = 0
    for old, new in zip(known, incoming, strict=False):
        if old != new:
            break
        common += 1
    return common, common < len(known)


def find_tool_call(
    messages: Sequence[Mapping[str, Any]], before: int, tool_call_id: str
) -> Mapping[str, Any] | None:
    """The assistant tool call with `tool_call_id` among messages[:before], latest first."""
    for message in reversed(messages[:before]):
        for call in message.get("tool_calls") or ():
            if call.get("id") == tool_call_id:
                return call
    return None
