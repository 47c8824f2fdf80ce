"""Hostile clients on a real one-process server: clients that send a byte at a time, clients
that never read their answers, oversized bodies and headers. None of them stalls the others:
normal requests made meanwhile keep their latency within LATENCY_FACTOR x the idle p95 plus
LATENCY_SLACK_S, an oversized body is refused with a 413 before it is read, and the server is
idle and healthy afterwards.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import statistics
import time

import httpx
import pytest
from serving_harness import ADMIN_KEY, api, local_server

from serving.common.http import MAX_BODY_BYTES

MODEL = "sao-test"
LATENCY_FACTOR = 3.0
LATENCY_SLACK_S = 0.5
SLOW_CLIENTS = 8
NEVER_READERS = 4
NORMAL_REQUESTS = 24


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with local_server(tmp_path_factory.mktemp("hostile") / "buffer") as (thread, parts):
        status, session = api(thread.url, "/rl/start_session", {"tenant": "acme"})
        assert status == 200, session
        yield thread, parts, session["api_key"]


def chat_request(key: str, *, stream: bool = False, max_tokens: int = 2) -> bytes:
    """The raw bytes of one HTTP/1.1 chat completion request."""
    body = json.dumps(
        {
            "model": MODEL,
            "messages": [{"role": "user", "content": "hello there"}],
            "max_tokens": max_tokens,
            "stream": stream,
        }
    ).encode()
    head = (
        "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        f"Authorization: Bearer {key}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    )
    return head.encode() + body


async def read_status(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    """(status, body) of the HTTP response on `reader` (read to EOF: Connection: close)."""
    data = await reader.read()
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), body


async def byte_at_a_time(port: int, raw: bytes, delay_s: float) -> tuple[int, bytes]:
    """Send `raw` one byte per `delay_s` (headers and body alike), then read the answer."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        for i in range(len(raw)):
            writer.write(raw[i : i + 1])
            await writer.drain()
            await asyncio.sleep(delay_s)
        return await read_status(reader)
    finally:
        writer.close()


def never_reading_socket(port: int, raw: bytes) -> socket.socket:
    """A connection that sends its request and never reads: its receive buffer is tiny, so
    the server's writes back up as soon as the answer outgrows the kernel buffers."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1024)
    sock.connect(("127.0.0.1", port))
    sock.sendall(raw)
    return sock


async def timed_normal_requests(url: str, key: str, count: int) -> list[float]:
    """Latency (s) of `count` sequential chat completions and health checks, each checked."""
    latencies = []
    async with httpx.AsyncClient(base_url=url, timeout=60) as client:
        for i in range(count):
            start = time.monotonic()
            if i % 2:
                response = await client.get("/health")
            else:
                response = await client.post(
                    "/v1/chat/completions",
                    headers={"Authorization": f"Bearer {key}"},
                    json={
                        "model": MODEL,
                        "messages": [{"role": "user", "content": f"normal {i}"}],
                        "max_tokens": 2,
                    },
                )
            latencies.append(time.monotonic() - start)
            assert response.status_code == 200, response.text
    return latencies


def p95(values: list[float]) -> float:
    return statistics.quantiles(values, n=20)[-1]


def wait_idle(parts, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        status = parts.worker.engine.status()
        if status["running"] == 0 and status["queued"] == 0:
            return
        time.sleep(0.1)
    raise AssertionError(f"the worker is still busy: {parts.worker.engine.status()}")


def test_slow_and_never_reading_clients_do_not_stall_others(server):
    thread, parts, key = server
    port = thread.port

    async def under_attack() -> tuple[list, list[float]]:
        raw = chat_request(key)
        slow = [asyncio.create_task(byte_at_a_time(port, raw, 0.01)) for _ in range(SLOW_CLIENTS)]
        # never-reading clients: long streamed answers, and an export of the whole store
        export = (
            b"POST /rl/export HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Authorization: Bearer " + ADMIN_KEY.encode() + b"\r\nContent-Length: 2\r\n\r\n{}"
        )
        stuck = [
            never_reading_socket(port, chat_request(key, stream=True, max_tokens=64))
            for _ in range(NEVER_READERS)
        ] + [never_reading_socket(port, export)]
        try:
            await asyncio.sleep(0.2)  # every hostile client is connected and sending
            latencies = await timed_normal_requests(thread.url, key, NORMAL_REQUESTS)
            answers = await asyncio.wait_for(asyncio.gather(*slow), timeout=120)
        finally:
            for sock in stuck:
                sock.close()
        return answers, latencies

    # The first round compiles the engine's batched prefill / decode shapes (seconds each on
    # CPU; a production worker compiles them at startup with --warmup): measure the second.
    asyncio.run(under_attack())
    wait_idle(parts)
    idle = asyncio.run(timed_normal_requests(thread.url, key, NORMAL_REQUESTS))  # warm too
    bound = LATENCY_FACTOR * p95(idle) + LATENCY_SLACK_S
    # Best of two measured rounds: a shape first met under attack, or another process taking
    # the 2 cores for a second, delays one round; a stall by the hostile clients delays both.
    for _ in range(2):
        wait_idle(parts)
        answers, attacked = asyncio.run(under_attack())
        if p95(attacked) <= bound:
            break
    print(
        f"\nslow clients: idle p50 {statistics.median(idle) * 1e3:.0f} ms p95 "
        f"{p95(idle) * 1e3:.0f} ms; with {SLOW_CLIENTS} byte-at-a-time and "
        f"{NEVER_READERS + 1} never-reading clients p50 {statistics.median(attacked) * 1e3:.0f} ms "
        f"p95 {p95(attacked) * 1e3:.0f} ms max {max(attacked) * 1e3:.0f} ms "
        f"(bound {bound * 1e3:.0f} ms)"
    )
    assert p95(attacked) <= bound
    # the slow clients were served correctly, just slowly
    for status, body in answers:
        assert status == 200, body
        assert json.loads(body)["object"] == "chat.completion"
    wait_idle(parts)  # the abandoned streams released their slots
    assert asyncio.run(timed_normal_requests(thread.url, key, 2))


def raw_exchange(port: int, head: bytes, body_sent: bytes, timeout_s: float = 10):
    """Send `head` and `body_sent` (possibly less than the head announces), then read the
    answer: (status, body, seconds from the last byte sent to the status line)."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout_s) as sock:
        sock.sendall(head)
        with contextlib.suppress(ConnectionError):  # the server may close while we send
            sock.sendall(body_sent)
        start = time.monotonic()
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = sock.recv(65536)
            if not chunk:
                break
            data += chunk
        elapsed = time.monotonic() - start
        head_part, _, rest = data.partition(b"\r\n\r\n")
        return int(head_part.split(b" ", 2)[1]), head_part, rest, elapsed


def test_an_oversized_body_is_refused_before_it_is_read(server):
    """Content-Length past the limit: a 413 in OpenAI's shape at once, with the body still
    unsent (it used to be read, up to the 8 MiB limit, before the refusal)."""
    thread, parts, key = server
    announced = 1 << 30
    head = (
        "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        f"Authorization: Bearer {key}\r\nContent-Length: {announced}\r\n\r\n"
    ).encode()
    status, _, body, elapsed = raw_exchange(thread.port, head, b'{"model": "')
    assert status == 413 and elapsed < 2.0
    error = json.loads(body[: body.index(b"}}") + 2])["error"]
    assert error["code"] == "body_too_large" and str(MAX_BODY_BYTES) in error["message"]
    # chunked (no length announced): refused once past the limit, no more than that buffered
    chunk = b"x" * (1 << 20)
    chunked = head.replace(f"Content-Length: {announced}".encode(), b"Transfer-Encoding: chunked")
    body = b"".join(b"%x\r\n%s\r\n" % (len(chunk), chunk) for _ in range(9))
    status, _, _, _ = raw_exchange(thread.port, chunked, body)
    assert status == 413
    # a header line past aiohttp's 8190-byte limit: a 4xx from the HTTP parser
    huge_header = head.replace(b"Host: x", b"X-Pad: " + b"a" * 100_000)
    status, _, _, _ = raw_exchange(thread.port, huge_header, b"")
    assert 400 <= status < 500

    # the same oversized upload while normal requests run: they are not held up
    async def concurrent() -> list[float]:
        uploads = [
            asyncio.to_thread(raw_exchange, thread.port, head, b"x" * 65536) for _ in range(4)
        ]
        latencies, *answers = await asyncio.gather(
            timed_normal_requests(thread.url, key, 8), *uploads
        )
        assert all(answer[0] == 413 for answer in answers)
        return latencies

    latencies = asyncio.run(concurrent())
    assert max(latencies) < 5.0
    wait_idle(parts)
