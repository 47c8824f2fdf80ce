"""A huge request never holds up the rest: bodies are parsed and validated on worker threads,
prompts rendered and tokenized on the proxy's pool, and text that cannot fit the context is
refused before it is tokenized."""

import threading
import time

import httpx
import openai
import pytest
from serving_harness import api, local_server

MODEL = "sao-test"
HUGE_BYTES = 6 * 1024 * 1024


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with local_server(tmp_path_factory.mktemp("buffer")) as (thread, parts):
        yield thread, parts


def health_latency(url: str) -> float:
    start = time.perf_counter()
    assert httpx.get(url + "/health", timeout=30).status_code == 200
    return time.perf_counter() - start


def test_huge_requests_do_not_delay_health_or_other_calls(server):
    thread, _ = server
    status, session = api(thread.url, "/rl/start_session", {"tenant": "big"})
    assert status == 200
    key = session["api_key"]
    client = openai.OpenAI(base_url=thread.url + "/v1", api_key=key, max_retries=0, timeout=600)
    client.chat.completions.create(  # compiled and warm before timing anything
        model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=2
    )
    idle = sorted(health_latency(thread.url) for _ in range(20))
    words = "the quick brown fox jumps over the lazy dog " * (HUGE_BYTES // 44)
    chat = {"model": MODEL, "messages": [{"role": "user", "content": words}], "max_tokens": 4}
    respond = {"model": MODEL, "input": words, "max_output_tokens": 4}  # the Responses API
    answers: list[tuple[int, dict, float]] = []

    def send_huge(path, body):
        start = time.perf_counter()
        response = httpx.post(
            thread.url + path,
            json=body,
            headers={"Authorization": f"Bearer {key}"},
            timeout=120,
        )
        answers.append((response.status_code, response.json(), time.perf_counter() - start))

    huge = [("/v1/chat/completions", chat)] * 2 + [("/v1/responses", respond)]
    senders = [threading.Thread(target=send_huge, args=request) for request in huge]
    for sender in senders:
        sender.start()
    busy = []
    while any(s.is_alive() for s in senders):
        busy.append(health_latency(thread.url))
        time.sleep(0.01)
    normal = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "hello"}], max_tokens=4
    )
    for sender in senders:
        sender.join()
    assert normal.choices[0].finish_reason in ("stop", "length")
    # the huge bodies are valid JSON that cannot fit a 512-token context: a clear 400, fast
    assert [a[0] for a in answers] == [400, 400, 400]
    assert all(a[1]["error"]["code"] == "context_length_exceeded" for a in answers)
    assert max(a[2] for a in answers) < 30
    # /health stayed responsive while they were read, parsed and refused (the bound leaves
    # room for a loaded 2-core machine; the stall this guards against was ~5 s)
    idle_p95 = idle[int(0.95 * (len(idle) - 1))]
    assert busy, "the huge requests finished before /health was polled once"
    assert max(busy) < 3 * idle_p95 + 1.0, (idle_p95, sorted(busy)[-5:])
