"""The HTTP client base against a real loopback server: JSON calls, error answers re-raised as
the same ApiError, transport failures as the client's own error, byte / JSON-lines / SSE
streams, timeouts, the session reopened after close, and the blocking client."""

import asyncio
import json

import pytest
from aiohttp import web
from serving_harness import ServerThread

from serving.common.client import BlockingClient, ServiceClient
from serving.common.errors import ApiError
from serving.common.http import new_app, require_service_key

KEY = "service-key-1"


class Down(ConnectionError):
    """What the test client raises for a service it cannot reach."""


class Client(ServiceClient):
    def unavailable(self, error: BaseException) -> Exception:
        return Down(f"{self.url}: {type(error).__name__}")


def _app() -> web.Application:
    async def echo(request: web.Request) -> web.Response:
        require_service_key(request, KEY)
        return web.json_response({"got": await request.json() if request.can_read_body else None})

    async def busy(request: web.Request) -> web.Response:
        raise ApiError(429, "too many", code="busy", headers={"Retry-After": "3"})

    async def slow(request: web.Request) -> web.Response:
        await asyncio.sleep(5)
        return web.json_response({})

    async def lines(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse()
        await response.prepare(request)
        for i in range(3):  # split mid-line: the reader must join the pieces
            await response.write(json.dumps({"i": i}).encode()[:3])
            await response.write(json.dumps({"i": i}).encode()[3:] + b"\n")
        return response

    async def events(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for chunk in ({"n": 1}, {"n": 2}):
            await response.write(f": comment\ndata: {json.dumps(chunk)}\n\n".encode())
        await response.write(b'data: [DONE]\n\ndata: {"after": true}\n\n')
        return response

    async def garbage(request: web.Request) -> web.Response:
        return web.Response(text="not json", content_type="text/html")

    app = new_app()
    app.router.add_route("*", "/echo", echo)
    app.router.add_post("/busy", busy)
    app.router.add_get("/slow", slow)
    app.router.add_post("/lines", lines)
    app.router.add_post("/events", events)
    app.router.add_get("/garbage", garbage)
    return app


@pytest.fixture(scope="module")
def server():
    thread = ServerThread(_app())
    yield thread
    thread.stop()


def test_json_calls_errors_and_unavailable(server):
    async def run():
        client = Client(server.url + "/", api_key=KEY, timeout_s=0.5)
        assert client.url == server.url  # trailing / dropped
        assert await client.call("POST", "/echo", {"a": 1}) == {"got": {"a": 1}}
        assert await client.call("GET", "/echo") == {"got": None}
        with pytest.raises(ApiError) as error:
            await client.call("POST", "/busy", {})
        assert (error.value.status, error.value.code) == (429, "busy")
        assert error.value.headers["Retry-After"] == "3"  # passed on to the caller
        with pytest.raises(ApiError) as error:  # no key: the server's 401, as an ApiError
            await Client(server.url).call("GET", "/echo")
        assert error.value.status == 401
        with pytest.raises(Down, match="TimeoutError"):
            await client.call("GET", "/slow")
        with pytest.raises(Down, match="ContentTypeError"):  # an unreadable answer
            await client.call("GET", "/garbage")
        await client.close()
        # closed: the next call opens a new session
        assert await client.call("POST", "/echo", {"b": 2}) == {"got": {"b": 2}}
        await client.close()
        with pytest.raises(Down, match="ClientConnectorError"):
            await Client("http://127.0.0.1:9").call("GET", "/x")
        # the base names the failure itself when a client does not
        with pytest.raises(ApiError) as error:
            await ServiceClient("http://127.0.0.1:9").call("GET", "/x")
        assert (error.value.status, error.value.code) == (503, "service_unavailable")

    asyncio.run(run())


def test_streams(server):
    async def run():
        client = Client(server.url, api_key=KEY)
        lines = [line async for line in client.stream_json_lines("/lines", {})]
        assert lines == [{"i": 0}, {"i": 1}, {"i": 2}]
        events = [event async for event in client.stream_sse("/events", {})]
        assert events == [{"n": 1}, {"n": 2}]  # nothing after [DONE]
        raw = b"".join([data async for data in client.stream_bytes("/lines", {})])
        assert raw.count(b"\n") == 3
        with pytest.raises(ApiError, match="too many"):
            async for _ in client.stream_bytes("/busy", {}):
                pass
        response = await client.open("/events", {})
        assert response.content_type == "text/event-stream"
        response.release()
        with pytest.raises(Down):
            async for _ in Client("http://127.0.0.1:9").stream_bytes("/lines", {}):
                pass
        await client.close()

    asyncio.run(run())


def test_blocking_client(server):
    client = BlockingClient(server.url, api_key=KEY, timeout_s=2)
    assert client.call("/echo", {"a": 1}) == {"got": {"a": 1}}
    assert client.call("/echo") == {"got": None}  # GET
    with pytest.raises(ApiError) as error:
        client.call("/busy", {})
    assert (error.value.status, error.value.headers.get("Retry-After")) == (429, "3")
    with pytest.raises(ApiError) as error:
        BlockingClient("http://127.0.0.1:9").call("/x")
    assert error.value.status == 503 and "unavailable" in error.value.message
