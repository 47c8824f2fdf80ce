"""ATDP events for what the data proxy sees: messages, tool results and lossless LLM calls.

- A system / user message (or an assistant message the agent wrote itself) is a `message`
  event, non-replayable (a person or the agent's code produced it).
- A tool result the agent sends back is a `tool_call` event: the typed call (name, arguments,
  call id, the tool's argument schema) as action, the returned text as result; approximate
  replay (a live tool may answer differently).
- A completion is an `llm_call` event: every input and output token id, per-token log-probs and
  policy versions, decoding parameters, template fingerprint, system-prompt version, exposed
  tools; the reply (text or typed tool calls) as action and its reasoning (the `<think>`
  block the client got as `reasoning_content`) as hidden state.
  Deterministic replay (seeded, dropless sampler), unless the session moved to another worker
  or a weight swap interrupted the reply: then approximate.
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from atdp_io import (
    Action,
    ActionKind,
    DecodingParams,
    Event,
    EventKind,
    EventMetadata,
    LLMCall,
    ReplayClass,
    ToolCall,
)
from serving.proxy.conversation import find_tool_call, message_text, tool_call_arguments

_THINK = re.compile(r"<think>(.*?)(?:</think>|$)", re.DOTALL)


@dataclasses.dataclass(frozen=True)
class Generated:
    """A finished generation: output ids [N], log-probs [N], versions [N], the reply text."""

    output_ids: list[int]
    logprobs: list[float]
    versions: list[int]
    text: str
    finish_reason: str
    stop_reason: str | int | None = None
    queue_s: float = 0.0
    error: str | None = None


def system_prompt_version(messages: Sequence[Mapping[str, Any]]) -> str:
    """sha256 prefix of the system message text ("" without one)."""
    if messages and messages[0].get("role") == "system":
        return "sha256:" + hashlib.sha256(message_text(messages[0]).encode()).hexdigest()[:16]
    return ""


def _schema_of(tools: Sequence[Mapping[str, Any]] | None, name: str) -> Mapping[str, Any] | None:
    for tool in tools or ():
        function = tool.get("function", {})
        if function.get("name") == name:
            parameters = function.get("parameters")
            return parameters if isinstance(parameters, Mapping) else None
    return None


def _typed_call(call: Mapping[str, Any], tools, call_id: str = "") -> tuple[ToolCall, str]:
    """An ATDP ToolCall from an OpenAI one, and an error class when its arguments are not an
    object (kept as {"raw": text})."""
    function = call.get("function", call)
    name = function.get("name") or "unknown_tool"
    arguments = tool_call_arguments(call)
    error = ""
    if not isinstance(arguments, dict):
        arguments, error = {"raw": arguments}, "malformed_tool_arguments"
    typed = ToolCall(
        name=name,
        arguments=arguments,
        call_id=call_id or call.get("id") or "",
        argument_schema=_schema_of(tools, name),
    )
    return typed, error


def message_events(
    messages: Sequence[Mapping[str, Any]],
    start: int,
    tools: Sequence[Mapping[str, Any]] | None,
    metadata: EventMetadata,
) -> list[Event]:
    """Events for messages[start:] (the ones the session has not recorded yet)."""
    events = []
    for index in range(start, len(messages)):
        message = messages[index]
        role, text = message["role"], message_text(message)
        if role == "tool":
            call_id = message.get("tool_call_id", "")
            call = find_tool_call(messages, index, call_id)
            error = "" if call is not None else "unmatched_tool_call_id"
            typed, arg_error = _typed_call(
                call or {"function": {"name": "unknown_tool"}}, tools, call_id
            )
            events.append(
                Event(
                    EventKind.TOOL_CALL,
                    ReplayClass.APPROXIMATE,
                    action=Action(ActionKind.TOOL_CALLS, tool_calls=(typed,)),
                    result=text,
                    metadata=metadata,
                    error_class=error or arg_error,
                )
            )
            continue
        observation: dict[str, Any] = {"role": role, "content": text}
        if message.get("name"):
            observation["name"] = message["name"]
        if message.get("tool_calls"):
            observation["tool_calls"] = [
                {"name": c.name, "arguments": c.arguments, "call_id": c.call_id}
                for c, _ in (_typed_call(call, tools) for call in message["tool_calls"])
            ]
        events.append(
            Event(
                EventKind.MESSAGE,
                ReplayClass.NON_REPLAYABLE,
                observation=observation,
                metadata=metadata,
            )
        )
    return events


def reply_action(
    content: str, tool_calls: Sequence[Mapping[str, Any]], tools
) -> tuple[Action, str]:
    """The LLM event's action: typed tool calls (OpenAI entries) or a message."""
    if not tool_calls:
        return Action(ActionKind.MESSAGE, text=content), ""
    typed = [_typed_call(call, tools) for call in tool_calls]
    errors = [e for _, e in typed if e]
    return (
        Action(ActionKind.TOOL_CALLS, text=content, tool_calls=tuple(t for t, _ in typed)),
        errors[0] if errors else "",
    )


def llm_event(
    *,
    model_id: str,
    input_ids: Sequence[int],
    generated: Generated,
    decoding: DecodingParams,
    template_fingerprint: str,
    system_version: str,
    tools: Sequence[Mapping[str, Any]] | None,
    action: Action,
    metadata: EventMetadata,
    current_version: int,
    moved: bool,
    error_class: str = "",
    reasoning: str | None = None,
) -> Event:
    """The lossless record of one completion. `reasoning`: the reply's thinking as returned
    (None: taken from `<think>` blocks of the raw text, for /v1/completions)."""
    versions = np.asarray(generated.versions, np.int32)
    # float32 log-softmax can round a near-certain token's log-prob a hair above 0
    logprobs = np.minimum(np.asarray(generated.logprobs, np.float32), 0.0)
    mixed = versions.size > 0 and versions.min() != versions.max()
    if reasoning is None:
        thoughts = [m.strip() for m in _THINK.findall(generated.text) if m.strip()]
    else:
        thoughts = [reasoning] if reasoning else []
    call = LLMCall(
        model_id=model_id,
        policy_version=int(versions[0]) if versions.size else current_version,
        input_ids=np.asarray(input_ids, np.int32),
        output_ids=np.asarray(generated.output_ids, np.int32),
        output_logprobs=logprobs,
        decoding=decoding,
        prompt_template_fingerprint=template_fingerprint,
        system_prompt_version=system_version,
        tools=tuple(tools or ()),
        finish_reason=generated.finish_reason,
        output_versions=versions,
    )
    replay = ReplayClass.APPROXIMATE if (moved or mixed) else ReplayClass.DETERMINISTIC
    return Event(
        EventKind.LLM_CALL,
        replay,
        hidden={"reasoning": "\n".join(thoughts)} if thoughts else None,
        action=action,
        metadata=metadata,
        llm=call,
        error_class=error_class,
    )


CHAT_ENDPOINTS = ("chat", "responses")  # llm_calls whose reply continues the conversation


def is_first_sample(event: Event) -> bool:
    """Sample 0 of its request (a request with `n` > 1 records `decoding.extra.sample_index`):
    the one the conversation continues from."""
    return event.llm is None or not event.llm.decoding.extra.get("sample_index")


def conversation_from_events(events: Sequence[Event]) -> list[dict[str, Any]]:
    """The chat messages a recorded trajectory implies (to resume a session after a restart):
    messages and tool results as sent, completions (sample 0 of each) as the assistant
    replies returned."""
    messages: list[dict[str, Any]] = []
    for event in events:
        if event.metadata.extra.get("reported"):
            continue  # reported on /rl/event, not part of the conversation the agent resends
        if event.kind == EventKind.MESSAGE and isinstance(event.observation, Mapping):
            message = {
                "role": event.observation.get("role"),
                "content": event.observation.get("content", ""),
            }
            if event.observation.get("tool_calls"):
                message["tool_calls"] = [
                    {"function": {"name": c["name"], "arguments": c["arguments"]}}
                    for c in event.observation["tool_calls"]
                ]
            messages.append(message)
        elif event.kind == EventKind.TOOL_CALL and event.action is not None:
            call_id = event.action.tool_calls[0].call_id
            messages.append(
                {"role": "tool", "content": event.result or "", "tool_call_id": call_id}
            )
        elif (
            event.kind == EventKind.LLM_CALL
            and event.metadata.extra.get("endpoint") in CHAT_ENDPOINTS
            and is_first_sample(event)
        ):
            action = event.action
            message = {"role": "assistant", "content": action.text if action else ""}
            if action is not None and action.tool_calls:
                message["tool_calls"] = [
                    {"function": {"name": c.name, "arguments": dict(c.arguments)}}
                    for c in action.tool_calls
                ]
            if event.llm.finish_reason in ("stop", "length", "tool_calls"):
                messages.append(message)
    return messages
