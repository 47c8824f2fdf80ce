"""Clients of the router: in-process (`LocalRouterClient`) and HTTP (`HttpRouterClient`)."""

from __future__ import annotations

from typing import Any, Protocol

from serving.common.client import ServiceClient
from serving.common.errors import ApiError
from serving.router.router import Route, Router


class RouterClient(Protocol):
    async def route(self, session_id: str, *, proxy: str | None = None) -> Route: ...

    async def report_failure(self, session_id: str, worker: str) -> Route: ...

    async def release(self, session_id: str) -> None: ...

    async def workers(self) -> list[dict[str, Any]]: ...

    async def models(self) -> list[dict[str, Any]]: ...

    async def close(self) -> None: ...


class LocalRouterClient:
    def __init__(self, router: Router):
        self.router = router

    async def route(self, session_id: str, *, proxy: str | None = None) -> Route:
        return self.router.route(session_id, proxy=proxy)

    async def report_failure(self, session_id: str, worker: str) -> Route:
        return self.router.report_failure(session_id, worker)

    async def release(self, session_id: str) -> None:
        self.router.release(session_id)

    async def workers(self) -> list[dict[str, Any]]:
        return self.router.workers_status()

    async def models(self) -> list[dict[str, Any]]:
        if not self.router.models():
            await self.router.poll_once()
        return self.router.models()

    async def close(self) -> None:
        return None


class HttpRouterClient(ServiceClient):
    """The router at `url`; its answers are cached nowhere (pins live in the router)."""

    def __init__(self, url: str, *, service_key: str | None = None, timeout_s: float = 10.0):
        super().__init__(url, api_key=service_key, timeout_s=timeout_s)

    def unavailable(self, error: BaseException) -> Exception:
        return ApiError(503, f"the router is unavailable: {error}", code="router_unavailable")

    async def route(self, session_id: str, *, proxy: str | None = None) -> Route:
        return Route.from_json(
            await self.call("POST", "/route", {"session_id": session_id, "proxy": proxy})
        )

    async def report_failure(self, session_id: str, worker: str) -> Route:
        body = {"session_id": session_id, "worker": worker}
        return Route.from_json(await self.call("POST", "/report_failure", body))

    async def release(self, session_id: str) -> None:
        await self.call("POST", "/release", {"session_id": session_id})

    async def workers(self) -> list[dict[str, Any]]:
        return await self.call("GET", "/workers")

    async def models(self) -> list[dict[str, Any]]:
        return await self.call("GET", "/models")
