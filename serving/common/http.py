"""HTTP plumbing of the services' servers: bearer keys and app setup (their clients:
`serving.common.client`)."""

from __future__ import annotations

import hashlib
import hmac

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
