"""Clients of a data proxy: in-process (`LocalProxyClient`) and HTTP (`HttpProxyClient`).

`chat` / `completion` return the response body (a dict) or, for streaming requests, an async
iterator of ready-to-send SSE bytes; errors before the first byte are raised as `ApiError`.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Mapping
from typing import Any, Protocol

import aiohttp

from serving.common.client import ServiceClient
from serving.common.errors import ApiError
from serving.common.openai_requests import ChatRequest, CompletionRequest
from serving.proxy.events import AgentEvent
from serving.proxy.proxy import DataProxy
from serving.proxy.runner import CallContext


class ProxyClient(Protocol):
    async def open_session(
        self, session_id: str, tenant: str, governance: Mapping[str, Any], task: Mapping[str, Any]
    ) -> dict[str, Any]: ...

    async def chat(
        self, request: ChatRequest, call: CallContext
    ) -> dict[str, Any] | AsyncIterator[bytes]: ...

    async def completion(
        self, request: CompletionRequest, call: CallContext
    ) -> dict[str, Any] | AsyncIterator[bytes]: ...

    async def set_reward(
        self, session_id: str, tenant: str, value: float, *, interaction_id: str | None, source: str
    ) -> dict[str, Any]: ...

    async def end_session(
        self, session_id: str, tenant: str, *, success: bool | None, info: Mapping[str, Any]
    ) -> dict[str, Any]: ...

    async def record_event(self, session_id: str, tenant: str, event: AgentEvent) -> dict: ...

    def export(self, tenant: str | None, **kwargs: Any) -> AsyncIterator[bytes]: ...

    async def delete(
        self, tenant: str, *, requested_by: str, reason: str, **selector: Any
    ) -> list[str]: ...

    async def withdraw_consent(
        self, tenant: str, *, requested_by: str, **selector: Any
    ) -> list[str]: ...

    async def session_cost(self, session_id: str, tenant: str) -> dict[str, Any]: ...

    async def close(self) -> None: ...


def _event_body(event: AgentEvent) -> dict[str, Any]:
    """The /rl/event body of a parsed event (parsed again, identically, by the proxy)."""
    body = {k: v for k, v in event.to_json().items() if v not in (None, "")}
    if event.type != "approval":
        body.pop("approved", None)
    return body


class LocalProxyClient:
    """A data proxy in this process."""

    def __init__(self, proxy: DataProxy):
        self.proxy = proxy

    async def open_session(self, session_id, tenant, governance, task) -> dict[str, Any]:
        return await self.proxy.open_session(session_id, tenant, governance, task)

    async def chat(self, request: ChatRequest, call: CallContext):
        return await self.proxy.chat(request, call)

    async def completion(self, request: CompletionRequest, call: CallContext):
        return await self.proxy.completion(request, call)

    async def set_reward(self, session_id, tenant, value, *, interaction_id, source):
        return await self.proxy.set_reward(
            session_id, tenant, value, interaction_id=interaction_id, source=source
        )

    async def end_session(self, session_id, tenant, *, success, info):
        return await self.proxy.end_session(session_id, tenant, success=success, info=info)

    async def record_event(self, session_id, tenant, event):
        return await self.proxy.record_event(session_id, tenant, event)

    def export(self, tenant: str | None, **kwargs: Any) -> AsyncIterator[bytes]:
        return self.proxy.export(tenant, **kwargs)

    async def delete(self, tenant, *, requested_by, reason, **selector) -> list[str]:
        return await self.proxy.delete(tenant, requested_by=requested_by, reason=reason, **selector)

    async def withdraw_consent(self, tenant, *, requested_by, **selector) -> list[str]:
        return await self.proxy.withdraw_consent(tenant, requested_by=requested_by, **selector)

    async def session_cost(self, session_id, tenant) -> dict[str, Any]:
        return await self.proxy.session_cost(session_id, tenant)

    async def close(self) -> None:
        return None


class HttpProxyClient(ServiceClient):
    """A data proxy behind its HTTP API at `url`."""

    def __init__(self, url: str, *, service_key: str | None = None, timeout_s: float = 30.0):
        super().__init__(url, api_key=service_key, timeout_s=timeout_s)

    def unavailable(self, error: BaseException) -> Exception:
        return ApiError(
            503, f"data proxy {self.url} is unavailable: {error}", code="proxy_unavailable"
        )

    async def _call(self, path: str, body: dict[str, Any]) -> Any:
        return await self.call("POST", path, body)

    async def _stream_or_json(self, path: str, body: dict[str, Any]):
        response = await self.open(path, body)
        if response.content_type == "text/event-stream":
            return self._relay(response)
        try:
            return await response.json()
        finally:
            response.release()

    async def _relay(self, response: aiohttp.ClientResponse) -> AsyncIterator[bytes]:
        """The SSE bytes; a connection lost mid-stream ends it with an SSE error event (the
        client has its 200 already)."""
        try:
            async for data in response.content.iter_any():
                yield data
        except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError) as error:
            yield f"data: {json.dumps(self.unavailable(error).to_json())}\n\n".encode()
        finally:
            response.release()

    async def open_session(self, session_id, tenant, governance, task) -> dict[str, Any]:
        body = {
            "session_id": session_id,
            "tenant": tenant,
            "governance": dict(governance),
            "task": dict(task),
        }
        return await self._call("/sessions", body)

    async def chat(self, request: ChatRequest, call: CallContext):
        return await self._stream_or_json(
            "/chat", {"request": request.to_json(), "call": call.to_json()}
        )

    async def completion(self, request: CompletionRequest, call: CallContext):
        body = {"request": request.to_json(), "call": call.to_json()}
        return await self._stream_or_json("/completions", body)

    async def set_reward(self, session_id, tenant, value, *, interaction_id, source):
        body = {
            "session_id": session_id,
            "tenant": tenant,
            "value": value,
            "interaction_id": interaction_id,
            "source": source,
        }
        return await self._call("/reward", body)

    async def end_session(self, session_id, tenant, *, success, info):
        body = {"session_id": session_id, "tenant": tenant, "success": success, "info": dict(info)}
        return await self._call("/end", body)

    async def record_event(self, session_id, tenant, event):
        body = {"session_id": session_id, "tenant": tenant, "event": _event_body(event)}
        return await self._call("/event", body)

    def export(self, tenant: str | None, **kwargs: Any) -> AsyncIterator[bytes]:
        return self.stream_bytes("/export", {"tenant": tenant, **kwargs})

    async def delete(self, tenant, *, requested_by, reason, **selector) -> list[str]:
        body = {"tenant": tenant, "requested_by": requested_by, "reason": reason, **selector}
        return (await self._call("/delete", body))["deleted"]

    async def withdraw_consent(self, tenant, *, requested_by, **selector) -> list[str]:
        body = {"tenant": tenant, "requested_by": requested_by, **selector}
        return (await self._call("/withdraw_consent", body))["withdrawn"]

    async def session_cost(self, session_id, tenant) -> dict[str, Any]:
        return await self._call("/session_cost", {"session_id": session_id, "tenant": tenant})
