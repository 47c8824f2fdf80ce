"""Non-LLM boundaries an agent reports itself: tool calls, retrieval, memory, human approval.

An agent that runs its tools (or a retriever, a memory store, a human reviewer) in its own code
reports each one on `POST /rl/event`; the event joins the session's trajectory after the
completions so far, with its latency, error and version. Body (JSON object):

    type        "tool" | "retrieval" | "memory" | "approval"                       (required)
    name        the tool / retriever / memory store / approver                    (required)
    call_id     the tool call id the model emitted (tool, memory)
    arguments   object: the tool's arguments, the retrieval query, the memory operation
    result      any JSON: the tool's output, the retrieved items, the value read or written,
                the reviewer's comment
    approved    boolean, required for "approval"
    error       string: what failed (the event is recorded with it as error_class)
    latency_s   number >= 0: how long it took
    version     string: the tool / index / memory / reviewer version
    interaction_id   the completion this event follows (our completion id)
    session_id  with a tenant key: the session (or implicit trajectory) it belongs to

ATDP: a tool or memory operation is a `tool_call` event (typed call as action, result, error
class; approximate replay, since a live tool may answer differently); retrieval a `retrieval`
event (query and results as observation); an approval a `message` event from a human
(non-replayable). A tool result reported here is not recorded again when the agent sends the
same call's result back as a `tool` message.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Mapping
from typing import Any

from atdp_io import Action, ActionKind, Event, EventKind, EventMetadata, ReplayClass, ToolCall
from serving.common.errors import bad_request
from serving.proxy.attribution import composite_fields

EVENT_TYPES = ("tool", "retrieval", "memory", "approval")
_FIELDS = {
    "type",
    "name",
    "call_id",
    "arguments",
    "result",
    "approved",
    "error",
    "latency_s",
    "version",
    "interaction_id",
    "session_id",
}
MAX_ERROR_CHARS = 500


@dataclasses.dataclass(frozen=True)
class AgentEvent:
    """A validated `/rl/event` body (see the module docstring)."""

    type: str
    name: str
    call_id: str = ""
    arguments: dict[str, Any] = dataclasses.field(default_factory=dict)
    result: Any = None
    approved: bool | None = None
    error: str = ""
    latency_s: float | None = None
    version: str = ""
    interaction_id: str | None = None

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _string(body: Mapping, name: str, required: bool = False, limit: int = 256) -> str:
    value = body.get(name)
    if value is None and not required:
        return ""
    if not isinstance(value, str) or not value or len(value) > limit:
        raise bad_request(f"'{name}' must be a string of 1 to {limit} characters", param=name)
    return value


def parse_event(body: Mapping[str, Any]) -> AgentEvent:
    """Validate an `/rl/event` body; a 400 naming the field otherwise."""
    unknown = sorted(set(body) - _FIELDS)
    if unknown:
        raise bad_request(f"unrecognized event field(s): {', '.join(unknown)}", param=unknown[0])
    kind = body.get("type")
    if kind not in EVENT_TYPES:
        raise bad_request(f"'type' must be one of {list(EVENT_TYPES)}, got {kind!r}", param="type")
    arguments = body.get("arguments", {})
    if arguments is None:
        arguments = {}
    if not isinstance(arguments, dict):
        raise bad_request("'arguments' must be a JSON object", param="arguments")
    approved = body.get("approved")
    if kind == "approval" and not isinstance(approved, bool):
        raise bad_request("an approval needs 'approved': true or false", param="approved")
    if kind != "approval" and approved is not None:
        raise bad_request("'approved' is only for type 'approval'", param="approved")
    latency = body.get("latency_s")
    if latency is not None and (
        isinstance(latency, bool)
        or not isinstance(latency, (int, float))
        or not math.isfinite(latency)
        or latency < 0
    ):
        raise bad_request("'latency_s' must be a number >= 0", param="latency_s")
    return AgentEvent(
        type=kind,
        name=_string(body, "name", required=True),
        call_id=_string(body, "call_id"),
        arguments=arguments,
        result=body.get("result"),
        approved=approved,
        error=_string(body, "error", limit=MAX_ERROR_CHARS),
        latency_s=None if latency is None else float(latency),
        version=_string(body, "version"),
        interaction_id=_string(body, "interaction_id") or None,
    )


def event_record(
    event: AgentEvent,
    session_id: str,
    model_id: str,
    composite: Mapping[str, Any] | None = None,
) -> Event:
    """The ATDP event of a reported boundary (module docstring); `composite`: the attribution
    of the composite policy of the session's latest call (`attribution.py`)."""
    extra: dict[str, Any] = {"event_type": event.type, "reported": True}
    if event.version:
        extra["version"] = event.version
    if event.error:
        extra["error"] = event.error
    metadata = EventMetadata(
        timestamp=time.time(),
        latency_s=event.latency_s,
        session_id=session_id,
        interaction_id=event.interaction_id or "",
        model_id=model_id,
        extra=extra,
        **composite_fields(composite),
    )
    error_class = f"{event.type}_error" if event.error else ""
    if event.type in ("tool", "memory"):
        call = ToolCall(
            name=event.name, arguments=event.arguments, call_id=event.call_id, version=event.version
        )
        return Event(
            EventKind.TOOL_CALL,
            ReplayClass.APPROXIMATE,
            action=Action(ActionKind.TOOL_CALLS, tool_calls=(call,)),
            result=event.result,
            metadata=metadata,
            error_class=error_class,
        )
    if event.type == "retrieval":
        return Event(
            EventKind.RETRIEVAL,
            ReplayClass.APPROXIMATE,
            observation={
                "retriever": event.name,
                "query": event.arguments,
                "results": event.result,
            },
            metadata=metadata,
            error_class=error_class,
        )
    return Event(
        EventKind.MESSAGE,
        ReplayClass.NON_REPLAYABLE,
        observation={
            "role": "human_approval",
            "approver": event.name,
            "approved": event.approved,
            "call_id": event.call_id,
            "comment": event.result,
        },
        metadata=metadata,
        error_class=error_class,
    )
