"""HTTP plumbing shared by the services: bearer keys, app setup, JSON-lines streams."""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
from aiohttp import web

from serving.common.errors import ApiError, error_middleware

MAX_BODY_BYTES = 8 << 20  # a long multi-turn conversation with tool outputs fits easily


def bearer_token(request: web.Request) -> str | None:
    header = request.headers.get("Authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return None
    return token.strip()


def key_digest(key: str) -> str:
    """sha256 hex of an API key: keys are stored and compared only as digests."""
    return hashlib.sha256(key.encode()).hexdigest()


def require_service_key(request: web.Request, key: str | None) -> None:
    """401 unless the request carries `key` (a no-op when the service runs without a key)."""
    if key is None:
        return
    token = bearer_token(request)
    if token is None or not hmac.compare_digest(key_digest(token), key_digest(key)):
        raise ApiError(401, "missing or wrong service key", code="invalid_api_key")


def new_app() -> web.Application:
    return web.Application(middlewares=[error_middleware], client_max_size=MAX_BODY_BYTES)


def service_headers(key: str | None) -> dict[str, str]:
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


async def json_lines(response: aiohttp.ClientResponse) -> AsyncIterator[dict[str, Any]]:
    """The JSON objects of a newline-delimited JSON stream, as they arrive."""
    buffer = b""
    async for data in response.content.iter_any():
        buffer += data
        *lines, buffer = buffer.split(b"\n")
        for line in lines:
            if line.strip():
                yield json.loads(line)
    if buffer.strip():
        yield json.loads(buffer)
