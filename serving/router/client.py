"""Clients of the router: in-process (`LocalRouterClient`) and HTTP (`HttpRouterClient`)."""

from __future__ import annotations

from typing import Any, Protocol

import aiohttp

from serving.common.errors import ApiError
from serving.common.http import raise_for_api_error, service_headers
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


class HttpRouterClient:
    """The router at `url`; its answers are cached nowhere (pins live in the router)."""

    def __init__(self, url: str, *, service_key: str | None = None, timeout_s: float = 10.0):
        self.url = url.rstrip("/")
        self._headers = service_headers(service_key)
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._session: aiohttp.ClientSession | None = None

    def _http(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                headers=self._headers,
                timeout=self._timeout,
                connector=aiohttp.TCPConnector(limit=512),
            )
        return self._session

    async def _call(self, method: str, path: str, body: dict | None = None) -> Any:
        try:
            async with self._http().request(method, f"{self.url}{path}", json=body) as response:
                await raise_for_api_error(response)
                return await response.json()
        except (TimeoutError, aiohttp.ClientConnectionError) as error:
            raise ApiError(
                503, f"the router is unavailable: {error}", code="router_unavailable"
            ) from None

    async def route(self, session_id: str, *, proxy: str | None = None) -> Route:
        return Route.from_json(
            await self._call("POST", "/route", {"session_id": session_id, "proxy": proxy})
        )

    async def report_failure(self, session_id: str, worker: str) -> Route:
        body = {"session_id": session_id, "worker": worker}
        return Route.from_json(await self._call("POST", "/report_failure", body))

    async def release(self, session_id: str) -> None:
        await self._call("POST", "/release", {"session_id": session_id})

    async def workers(self) -> list[dict[str, Any]]:
        return await self._call("GET", "/workers")

    async def models(self) -> list[dict[str, Any]]:
        return await self._call("GET", "/models")

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
