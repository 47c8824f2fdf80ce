"""The base of the services' HTTP clients (worker, router, data proxy, upstream server).

`ServiceClient` owns what each client would otherwise repeat:

- one aiohttp session per client, opened on first use (on the event loop that uses it) and
  reopened after `close()`; its bearer key in every request;
- timeouts: a JSON call may take `timeout_s` in all; a stream has no total limit by default
  (the service ends long work itself: the worker's request timeout) but must connect within
  `connect_timeout_s`;
- errors: an error answer (4xx / 5xx with OpenAI's error body) is re-raised as the same
  `ApiError`, status and Retry-After kept; a service that cannot be reached, times out, drops
  the connection or answers something unreadable raises `self.unavailable(error)`, which each
  client names (`WorkerUnavailable`, a 503 `router_unavailable`, ...). There are no retries:
  the caller decides (the router re-pins a session whose worker is unavailable);
- bodies: JSON calls, raw byte streams, JSON-lines streams and SSE `data:` streams.

`BlockingClient` is the same for synchronous callers (agent harnesses, scripts): urllib, no
event loop, one connection per call, the same error mapping (`gateway/client.py` uses it).
"""

from __future__ import annotations

import contextlib
import json
import urllib.error
import urllib.request
from collections.abc import AsyncIterator
from typing import Any

import aiohttp

from serving.common.errors import ApiError

# What "the service is unavailable" means to every client: no connection, a timeout, a
# dropped or malformed answer (aiohttp.ClientError covers connection, payload and content
# type errors; error answers are ApiErrors, raised before these can occur).
TRANSPORT_ERRORS = (TimeoutError, aiohttp.ClientError)
CONNECTIONS_PER_CLIENT = 512  # a gateway or proxy keeps many streams open to one service


def service_headers(key: str | None) -> dict[str, str]:
    """The bearer header of a service or API key (none without a key)."""
    return {} if key is None else {"Authorization": f"Bearer {key}"}


async def raise_for_api_error(response: aiohttp.ClientResponse) -> None:
    """Turn another service's error answer back into the same `ApiError`."""
    if response.status < 400:
        return
    try:
        body: Any = await response.json(content_type=None)
    except (json.JSONDecodeError, aiohttp.ContentTypeError, UnicodeDecodeError):
        body = await response.text()
    error = ApiError.from_json(response.status, body)
    if "Retry-After" in response.headers:
        error.headers["Retry-After"] = response.headers["Retry-After"]
    raise error


class ServiceClient:
    """A service at `url` (its base: http://host:port, or an OpenAI server's .../v1).

    Args:
      api_key: bearer key sent with every request (None: no header).
      timeout_s: longest a JSON call may take.
      connect_timeout_s: longest connecting may take (None: `timeout_s`).
      stream_timeout_s: longest a stream may take in all (None: no limit).
    """

    def __init__(
        self,
        url: str,
        *,
        api_key: str | None = None,
        timeout_s: float = 10.0,
        connect_timeout_s: float | None = None,
        stream_timeout_s: float | None = None,
    ):
        self.url = url.rstrip("/")
        self.name = self.url
        self._headers = service_headers(api_key)
        connect = timeout_s if connect_timeout_s is None else connect_timeout_s
        self.timeout = aiohttp.ClientTimeout(total=timeout_s, sock_connect=connect)
        self.stream_timeout = aiohttp.ClientTimeout(total=stream_timeout_s, sock_connect=connect)
        self._session: aiohttp.ClientSession | None = None

    def unavailable(self, error: BaseException) -> Exception:
        """The exception raised when the service fails to answer (subclasses name it)."""
        return ApiError(
            503,
            f"{self.url} is unavailable: {type(error).__name__}: {error}",
            code="service_unavailable",
        )

    def http(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                headers=self._headers,
                connector=aiohttp.TCPConnector(limit=CONNECTIONS_PER_CLIENT),
            )
        return self._session

    async def call(
        self, method: str, path: str, body: Any = None, *, timeout_s: float | None = None
    ) -> Any:
        """The JSON answer of `method url+path` with a JSON `body`."""
        timeout = self.timeout if timeout_s is None else aiohttp.ClientTimeout(total=timeout_s)
        try:
            async with self.http().request(
                method, self.url + path, json=body, timeout=timeout
            ) as response:
                await raise_for_api_error(response)
                return await response.json()
        except TRANSPORT_ERRORS as error:
            raise self.unavailable(error) from None

    @contextlib.asynccontextmanager
    async def streaming(self, path: str, body: Any) -> AsyncIterator[aiohttp.ClientResponse]:
        """POST `body` and hold the (successful) response open while the block reads it; a
        transport failure inside the block is `unavailable` too."""
        try:
            async with self.http().post(
                self.url + path, json=body, timeout=self.stream_timeout
            ) as response:
                await raise_for_api_error(response)
                yield response
        except TRANSPORT_ERRORS as error:
            raise self.unavailable(error) from None

    async def open(self, path: str, body: Any) -> aiohttp.ClientResponse:
        """POST `body`; the successful response, unread (the caller must `release()` it)."""
        try:
            response = await self.http().post(
                self.url + path, json=body, timeout=self.stream_timeout
            )
        except TRANSPORT_ERRORS as error:
            raise self.unavailable(error) from None
        try:
            await raise_for_api_error(response)
        except BaseException:
            response.release()
            raise
        return response

    async def stream_bytes(self, path: str, body: Any) -> AsyncIterator[bytes]:
        """The answer's bytes as they arrive."""
        async with self.streaming(path, body) as response:
            async for data in response.content.iter_any():
                yield data

    async def stream_json_lines(self, path: str, body: Any) -> AsyncIterator[Any]:
        """The JSON values of a newline-delimited JSON answer, as they arrive."""
        async with self.streaming(path, body) as response:
            async for line in json_lines(response):
                yield line

    async def stream_sse(self, path: str, body: Any) -> AsyncIterator[Any]:
        """The JSON `data:` values of a server-sent-events answer, until `[DONE]`."""
        async with self.streaming(path, body) as response:
            async for data in sse_data(response):
                yield data

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None


class BlockingClient:
    """A service at `url`, called synchronously; `unavailable` as in `ServiceClient`."""

    def __init__(self, url: str, *, api_key: str | None = None, timeout_s: float = 120.0):
        self.url = url.rstrip("/")
        self.timeout_s = timeout_s
        self._headers = {**service_headers(api_key), "Content-Type": "application/json"}

    def unavailable(self, error: BaseException) -> Exception:
        return ApiError(
            503,
            f"{self.url} is unavailable: {type(error).__name__}: {error}",
            code="service_unavailable",
        )

    def request(self, path: str, body: Any = None, *, method: str | None = None) -> bytes:
        """The answer's bytes: GET without a body, else POST of JSON `body` (or `method`)."""
        data = None if body is None else json.dumps(body).encode()
        method = method or ("GET" if body is None else "POST")
        request = urllib.request.Request(
            self.url + path, data=data, method=method, headers=self._headers
        )
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                return response.read()
        except urllib.error.HTTPError as answer:  # an error answer: the service's ApiError
            try:
                payload: Any = json.loads(answer.read())
            except ValueError:
                payload = None
            error = ApiError.from_json(answer.code, payload)
            if answer.headers.get("Retry-After"):
                error.headers["Retry-After"] = answer.headers["Retry-After"]
            raise error from None
        except (urllib.error.URLError, TimeoutError, ConnectionError) as error:
            raise self.unavailable(error) from None

    def call(self, path: str, body: Any = None, *, method: str | None = None) -> Any:
        """The JSON answer of `request`."""
        return json.loads(self.request(path, body, method=method))


async def json_lines(response: aiohttp.ClientResponse) -> AsyncIterator[Any]:
    """The JSON values of a newline-delimited JSON stream, as they arrive."""
    buffer = b""
    async for data in response.content.iter_any():
        buffer += data
        *lines, buffer = buffer.split(b"\n")
        for line in lines:
            if line.strip():
                yield json.loads(line)
    if buffer.strip():
        yield json.loads(buffer)


async def sse_data(response: aiohttp.ClientResponse) -> AsyncIterator[Any]:
    """The JSON `data:` values of an SSE stream, until `data: [DONE]` or its end."""
    buffer = b""
    async for data in response.content.iter_any():
        buffer += data
        *events, buffer = buffer.split(b"\n\n")
        for event in events:
            for line in event.split(b"\n"):
                if not line.startswith(b"data:"):
                    continue
                payload = line[5:].strip()
                if payload == b"[DONE]":
                    return
                yield json.loads(payload)
