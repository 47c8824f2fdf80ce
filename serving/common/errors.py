"""OpenAI-shaped errors and the aiohttp middleware that turns every failure into one.

Every service answers errors as `{"error": {"message", "type", "param", "code"}}` with the
status OpenAI uses (400 bad request, 401 bad key, 403 forbidden, 404 unknown model / session,
409 conflict, 413 body too large, 429 over capacity, 503 unavailable, 504 timeout). A handler
raises `ApiError`; anything unexpected is logged and answered 500, and the server keeps serving.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

logger = logging.getLogger(__name__)

_TYPE_BY_STATUS = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    409: "conflict_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
    500: "server_error",
    503: "service_unavailable",
    504: "timeout_error",
}


class ApiError(Exception):
    """An error answered to the caller: HTTP `status` plus OpenAI's error fields."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        error_type: str | None = None,
        headers: dict[str, str] | None = None,
    ):
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.error_type = error_type or _TYPE_BY_STATUS.get(status, "server_error")
        self.headers = headers or {}

    def to_json(self) -> dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": self.error_type,
                "param": self.param,
                "code": self.code,
            }
        }

    def response(self) -> web.Response:
        return web.json_response(self.to_json(), status=self.status, headers=self.headers)

    @classmethod
    def from_json(cls, status: int, body: Any) -> ApiError:
        """Rebuilds an error answered by another service (keeps its status and fields)."""
        error = body.get("error") if isinstance(body, dict) else None
        if not isinstance(error, dict):
            return cls(status, f"upstream answered {status}: {str(body)[:200]}")
        return cls(
            status,
            str(error.get("message", "")),
            param=error.get("param"),
            code=error.get("code"),
            error_type=error.get("type"),
        )


def bad_request(message: str, *, param: str | None = None, code: str | None = None) -> ApiError:
    return ApiError(400, message, param=param, code=code)


# Deeper bodies are refused before any handler walks them: validation, redaction and the
# ATDP encoders recurse per level, and Python's parser itself gives up near 1000 levels.
MAX_JSON_DEPTH = 64


def _is_text(value: str) -> bool:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate ("\ud800" is valid JSON, not valid text)
        return False
    return True


# Bodies larger than this are parsed (and, at the gateway, validated) on a worker thread.
OFF_LOOP_BYTES = 64 * 1024


def check_json_body(body: Any) -> None:
    """400 for a parsed body deeper than MAX_JSON_DEPTH or with a string (value or key) that
    is not Unicode text, so nothing behind the parser (tokenizer, redactor, the store's UTF-8
    encoding) meets either. Iterative: the check itself cannot overflow the stack."""
    stack = [(body, 1)]
    while stack:
        item, level = stack.pop()
        if isinstance(item, str):
            if not _is_text(item):
                raise bad_request(
                    "the request body has a string that is not valid Unicode (a lone "
                    "surrogate escape such as \\ud800)",
                    code="invalid_unicode",
                )
        elif isinstance(item, (dict, list)):
            if level > MAX_JSON_DEPTH:
                raise bad_request(
                    f"the request body nests deeper than {MAX_JSON_DEPTH} levels",
                    code="too_deep",
                )
            children = [*item.keys(), *item.values()] if isinstance(item, dict) else item
            stack.extend((child, level + 1) for child in children)


async def read_json_object(request: web.Request) -> dict[str, Any]:
    """The request body as a JSON object, or a 400 that says what is wrong with it."""
    length, limit = request.content_length, request.client_max_size
    if length is not None and length > limit:
        # Answered before reading a byte of it (aiohttp's own check buffers up to the limit
        # first); aiohttp then discards what the client still sends and closes.
        raise ApiError(
            413,
            f"request body too large: Content-Length {length} bytes, the limit is {limit}",
            code="body_too_large",
        )
    raw = await request.read()  # a chunked body: aiohttp answers 413 past client_max_size
    if not raw:
        raise bad_request("the request body is empty; expected a JSON object")
    if len(raw) > OFF_LOOP_BYTES:  # parsing megabytes takes long enough to stall other calls
        return await asyncio.to_thread(parse_json_object, raw)
    return parse_json_object(raw)


def parse_json_object(raw: bytes) -> dict[str, Any]:
    """`raw` as a checked JSON object (see `read_json_object`)."""
    try:
        body = json.loads(raw)
    except RecursionError:
        raise bad_request(
            f"the request body nests deeper than {MAX_JSON_DEPTH} levels", code="too_deep"
        ) from None
    except ValueError as error:  # also UnicodeDecodeError and a number past the digit limit
        raise bad_request(f"the request body is not valid JSON: {error}") from None
    if not isinstance(body, dict):
        raise bad_request(f"the request body must be a JSON object, got {type(body).__name__}")
    check_json_body(body)
    return body


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@web.middleware
async def error_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Answers `ApiError`, aiohttp's HTTP errors and unexpected exceptions in OpenAI's shape."""
    try:
        return await handler(request)
    except ApiError as error:
        return error.response()
    except web.HTTPException as error:
        if error.status < 400:
            raise
        message = error.text or error.reason
        if error.status == 404:
            message = f"unknown endpoint {request.method} {request.path}"
        elif error.status == 405:
            message = f"method {request.method} is not allowed on {request.path}"
        elif error.status == 413:
            message = f"request body too large ({error.text})"
        return ApiError(error.status, message).response()
    except (ConnectionResetError, TimeoutError) as error:
        if isinstance(error, TimeoutError):
            return ApiError(504, "the request timed out", code="timeout").response()
        raise
    except Exception:
        logger.exception("unhandled error on %s %s", request.method, request.path)
        return ApiError(500, "internal server error (logged on the server)").response()
