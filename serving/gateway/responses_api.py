"""The Responses API over the chat path: Response objects and stream events built from a chat
completion (or its SSE stream), and the stored conversations `previous_response_id` names.

A response's id is its chat completion's interaction id, so `/rl/set_reward` takes it as is.
The stream is translated event by event: response.created / in_progress, then per output
item output_item.added, content_part.added, reasoning_text.delta ... done (the thinking, from
`reasoning_content`), output_item.added, content_part.added, output_text.delta ... done (a
message), or output_item.added, function_call_arguments.delta / done (a tool call), and finally
response.completed (or response.incomplete when the token limit cut the reply short). Every
event carries a sequence_number.
"""

from __future__ import annotations

import collections
import json
import time
from collections.abc import AsyncIterator, Mapping
from typing import Any

from serving.common.errors import ApiError
from serving.common.ids import opaque_id
from serving.common.responses_requests import ResponsesRequest

MAX_STORED = 10_000  # responses kept for previous_response_id (oldest dropped first)


class ResponseStore:
    """Stored responses by id, each with its owner (a session or tenant key's scope) and the
    conversation it ends (chat messages: the history, the input and the reply). In memory:
    bounded, and gone after a restart (a later previous_response_id is then a 404)."""

    def __init__(self, capacity: int = MAX_STORED):
        self.capacity = capacity
        self._items: collections.OrderedDict[str, tuple[str, list, dict]] = (
            collections.OrderedDict()
        )

    def put(self, owner: str, body: dict[str, Any], conversation: list[dict[str, Any]]) -> None:
        self._items[body["id"]] = (owner, conversation, body)
        self._items.move_to_end(body["id"])
        while len(self._items) > self.capacity:
            self._items.popitem(last=False)

    def get(self, owner: str, response_id: str, param: str | None = None):
        """(conversation, body); a 404 for an unknown id or another owner's (indistinguishable)."""
        item = self._items.get(response_id)
        if item is None or item[0] != owner:
            raise ApiError(
                404,
                f"no stored response {response_id!r} (responses are kept in memory, for this "
                f"key, up to the last {self.capacity}; store=false ones are not kept)",
                param=param,
                code="response_not_found",
            )
        return item[1], item[2]


def _message_item(text: str, status: str = "completed") -> dict[str, Any]:
    return {
        "type": "message",
        "id": opaque_id("msg_", 24),
        "status": status,
        "role": "assistant",
        "content": [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}],
    }


def _reasoning_item(text: str, status: str = "completed") -> dict[str, Any]:
    return {
        "type": "reasoning",
        "id": opaque_id("rs_", 24),
        "summary": [],
        "content": [{"type": "reasoning_text", "text": text}],
        "status": status,
    }


def _call_item(call: Mapping[str, Any], status: str = "completed") -> dict[str, Any]:
    return {
        "type": "function_call",
        "id": opaque_id("fc_", 24),
        "call_id": call["id"],
        "name": call["function"]["name"],
        "arguments": call["function"]["arguments"],
        "status": status,
    }


def _usage(chat_usage: Mapping[str, int]) -> dict[str, Any]:
    return {
        "input_tokens": chat_usage["prompt_tokens"],
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": chat_usage["completion_tokens"],
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": chat_usage["total_tokens"],
    }


def response_body(
    request: ResponsesRequest,
    *,
    response_id: str,
    created: float,
    model: str,
    output: list[dict[str, Any]],
    finish_reason: str | None,
    usage: Mapping[str, int] | None,
    policy_version: int | None,
) -> dict[str, Any]:
    """A Response object; status in_progress until finish_reason is known."""
    if finish_reason is None:
        status, incomplete = "in_progress", None
    elif finish_reason == "length":
        status, incomplete = "incomplete", {"reason": "max_output_tokens"}
    else:
        status, incomplete = "completed", None
    return {
        "id": response_id,
        "object": "response",
        "created_at": created,
        "status": status,
        "error": None,
        "incomplete_details": incomplete,
        "model": model,
        "output": output,
        "previous_response_id": request.previous_response_id,
        "store": request.store,
        "usage": _usage(usage) if usage is not None else None,
        "policy_version": policy_version,
        **request.echo,
    }


def output_items(message: Mapping[str, Any], finish_reason: str) -> list[dict[str, Any]]:
    """A chat reply message as Responses output items: its reasoning (`reasoning_content`),
    its text, then its tool calls."""
    status = "incomplete" if finish_reason == "length" else "completed"
    items = []
    if message.get("reasoning_content") is not None:
        reasoning_status = status if message.get("content") is None else "completed"
        items.append(_reasoning_item(message["reasoning_content"], reasoning_status))
    if message.get("content"):
        items.append(_message_item(message["content"], status))
    return items + [_call_item(call) for call in message.get("tool_calls") or ()]


def reply_message(output: list[dict[str, Any]]) -> dict[str, Any]:
    """Output items back as the chat assistant message a later call's history holds. The
    reasoning is left out, as chat clients leave out `reasoning_content`: the data proxy then
    recognises the echoed reply and reuses its sampled ids (thinking included)."""
    text = "".join(
        part["text"] for item in output if item["type"] == "message" for part in item["content"]
    )
    calls = [
        {
            "id": item["call_id"],
            "type": "function",
            "function": {"name": item["name"], "arguments": item["arguments"]},
        }
        for item in output
        if item["type"] == "function_call"
    ]
    message: dict[str, Any] = {"role": "assistant", "content": text or None}
    if calls:
        message["tool_calls"] = calls
    elif not text:
        message["content"] = ""
    return message


def from_chat_completion(request: ResponsesRequest, completion: Mapping[str, Any]) -> dict:
    """The Response object of a finished (non-streamed) chat completion."""
    choice = completion["choices"][0]
    return response_body(
        request,
        response_id=completion["id"],
        created=completion["created"],
        model=completion["model"],
        output=output_items(choice["message"], choice["finish_reason"]),
        finish_reason=choice["finish_reason"],
        usage=completion["usage"],
        policy_version=completion.get("policy_version"),
    )


async def sse_payloads(stream: AsyncIterator[bytes]) -> AsyncIterator[Any]:
    """The JSON payloads of an SSE byte stream (any chunking), up to `[DONE]`."""
    buffer = b""
    async for data in stream:
        buffer += data
        while b"\n\n" in buffer:
            event, buffer = buffer.split(b"\n\n", 1)
            for line in event.split(b"\n"):
                if line.startswith(b"data: "):
                    payload = line[len(b"data: ") :]
                    if payload == b"[DONE]":
                        return
                    yield json.loads(payload)


class EventWriter:
    """Responses stream events as SSE bytes, numbered in order."""

    def __init__(self):
        self.sequence = 0

    def __call__(self, kind: str, **fields: Any) -> bytes:
        event = {"type": kind, "sequence_number": self.sequence, **fields}
        self.sequence += 1
        return f"event: {kind}\ndata: {json.dumps(event, ensure_ascii=False)}\n\n".encode()


async def stream_events(
    request: ResponsesRequest,
    chat_stream: AsyncIterator[bytes],
    model: str,
    on_done,
) -> AsyncIterator[bytes]:
    """Translate a chat completion stream into Responses events; `on_done(body)` gets the
    final Response object (to store it) before response.completed is sent."""
    try:
        async for data in _translate(request, chat_stream, model, on_done):
            yield data
    finally:  # a client gone mid-stream: the chat stream (and its generation) ends too
        await chat_stream.aclose()


async def _translate(request, chat_stream, model, on_done) -> AsyncIterator[bytes]:
    emit = EventWriter()
    response: dict[str, Any] | None = None
    text, message, output = "", None, []
    thought, reasoning = "", None  # the open reasoning item and its text so far
    finish, usage, version = None, None, None
    async for payload in sse_payloads(chat_stream):
        if "error" in payload:
            error = payload["error"]
            yield emit(
                "error",
                code=error.get("code"),
                message=error.get("message"),
                param=error.get("param"),
            )
            return
        if response is None:
            response = response_body(
                request,
                response_id=payload["id"],
                created=payload.get("created", time.time()),
                model=model,
                output=[],
                finish_reason=None,
                usage=None,
                policy_version=None,
            )
            yield emit("response.created", response=response)
            yield emit("response.in_progress", response=response)
        if payload.get("usage"):
            usage = payload["usage"]
        for choice in payload.get("choices") or ():
            delta = choice.get("delta") or {}
            if delta.get("reasoning_content"):
                if reasoning is None:
                    reasoning = _reasoning_item("", "in_progress")
                    reasoning["content"] = []
                    output.append(reasoning)
                    index = len(output) - 1
                    yield emit("response.output_item.added", output_index=index, item=reasoning)
                    yield emit(
                        "response.content_part.added",
                        item_id=reasoning["id"],
                        output_index=index,
                        content_index=0,
                        part={"type": "reasoning_text", "text": ""},
                    )
                thought += delta["reasoning_content"]
                yield emit(
                    "response.reasoning_text.delta",
                    item_id=reasoning["id"],
                    output_index=output.index(reasoning),
                    content_index=0,
                    delta=delta["reasoning_content"],
                )
            if delta.get("content") or delta.get("tool_calls"):
                async for data in _close_reasoning(emit, reasoning, output, thought):
                    yield data
            if delta.get("content"):
                if message is None:
                    message = _message_item("", "in_progress")
                    message["content"] = []
                    output.append(message)
                    index = len(output) - 1
                    yield emit("response.output_item.added", output_index=index, item=message)
                    part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
                    yield emit(
                        "response.content_part.added",
                        item_id=message["id"],
                        output_index=index,
                        content_index=0,
                        part=part,
                    )
                text += delta["content"]
                yield emit(
                    "response.output_text.delta",
                    item_id=message["id"],
                    output_index=output.index(message),
                    content_index=0,
                    delta=delta["content"],
                    logprobs=[],
                )
            for call in delta.get("tool_calls") or ():
                async for data in _close_message(emit, message, output, text):
                    yield data
                message = None
                item = _call_item(call, "in_progress")
                item["arguments"] = ""
                output.append(item)
                index = len(output) - 1
                yield emit("response.output_item.added", output_index=index, item=item)
                arguments = call["function"]["arguments"]
                yield emit(
                    "response.function_call_arguments.delta",
                    item_id=item["id"],
                    output_index=index,
                    delta=arguments,
                )
                yield emit(
                    "response.function_call_arguments.done",
                    item_id=item["id"],
                    output_index=index,
                    arguments=arguments,
                )
                item.update(arguments=arguments, status="completed")
                yield emit("response.output_item.done", output_index=index, item=item)
            if choice.get("finish_reason"):
                finish = choice["finish_reason"]
                version = payload.get("policy_version")
    async for data in _close_reasoning(emit, reasoning, output, thought, finish):
        yield data
    async for data in _close_message(emit, message, output, text, finish):
        yield data
    if response is None or finish is None:
        return  # the chat stream ended early (the client went away)
    final = response_body(
        request,
        response_id=response["id"],
        created=response["created_at"],
        model=model,
        output=output,
        finish_reason=finish,
        usage=usage,
        policy_version=version,
    )
    on_done(final)
    kind = "response.incomplete" if final["status"] == "incomplete" else "response.completed"
    yield emit(kind, response=final)


async def _close_message(emit, message, output, text, finish=None) -> AsyncIterator[bytes]:
    """The done events of the open message item, if any (before a tool call or at the end)."""
    if message is None or message["status"] != "in_progress":
        return
    index = output.index(message)
    part = {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
    yield emit(
        "response.output_text.done",
        item_id=message["id"],
        output_index=index,
        content_index=0,
        text=text,
        logprobs=[],
    )
    yield emit(
        "response.content_part.done",
        item_id=message["id"],
        output_index=index,
        content_index=0,
        part=part,
    )
    message.update(content=[part], status="incomplete" if finish == "length" else "completed")
    yield emit("response.output_item.done", output_index=index, item=message)


async def _close_reasoning(emit, item, output, text, finish=None) -> AsyncIterator[bytes]:
    """The done events of the open reasoning item, if any (when the answer starts, or at the
    end: a reply cut by the token limit while thinking leaves it incomplete)."""
    if item is None or item["status"] != "in_progress":
        return
    index = output.index(item)
    part = {"type": "reasoning_text", "text": text}
    yield emit(
        "response.reasoning_text.done",
        item_id=item["id"],
        output_index=index,
        content_index=0,
        text=text,
    )
    yield emit(
        "response.content_part.done",
        item_id=item["id"],
        output_index=index,
        content_index=0,
        part=part,
    )
    item.update(content=[part], status="incomplete" if finish == "length" else "completed")
    yield emit("response.output_item.done", output_index=index, item=item)
