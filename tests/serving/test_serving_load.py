"""Load on loopback: 32 concurrent multi-turn sessions x 16 completions each (a third of them
streamed), through a gateway whose concurrency limit is below the load, so agents meet 429s
and retry them with exponential backoff. No 5xx, no call lost: every acknowledged response
has exactly one durable ATDP event, and a refused (429) attempt leaves none."""

import asyncio
import collections
import functools
import random
import time

import openai
import pytest
from flax import nnx
from serving_harness import api, local_server, read_trajectories, shared_worker

from atdp_io import EventKind
from sao_jax.models import init_model

MODEL = "sao-test"
SESSIONS = 32
CALLS_PER_SESSION = 16
TURNS_PER_CONVERSATION = 6  # then the agent starts a fresh conversation in the same session
GATEWAY_LIMIT = 12  # completions in flight at the gateway: below 32 agents, so 429s happen
# How long one call keeps retrying its 429s: a deadline, not an attempt count, since with full
# jitter a starved agent's attempts are short and a loaded machine serves slowly (200 attempts
# ran out on a 2-core machine with other jobs beside the test).
RETRY_BUDGET_S = 300.0
BACKOFF_S = 0.05  # first retry delay; doubles per attempt (with jitter), capped at 1 s


class Load:
    """What the agents saw: acknowledged reply ids per session, 429s retried, other errors."""

    def __init__(self):
        self.acknowledged: dict[str, set[str]] = collections.defaultdict(set)
        self.retried_429 = 0
        self.failures: list = []


async def call_with_backoff(load: Load, create):
    """`create()` until it is not a 429 (exponential backoff with full jitter), or None after
    RETRY_BUDGET_S of 429s or any other API error (recorded as a failure)."""
    deadline = time.monotonic() + RETRY_BUDGET_S
    attempt = 0
    while time.monotonic() < deadline:
        try:
            return await create()
        except openai.RateLimitError:
            load.retried_429 += 1
            await asyncio.sleep(random.uniform(0, min(1.0, BACKOFF_S * 2 ** min(attempt, 8))))
            attempt += 1
        except openai.APIError as error:
            load.failures.append(repr(error))
            return None
    load.failures.append(f"still 429 after {RETRY_BUDGET_S:.0f} s ({attempt} attempts)")
    return None


async def complete(client, messages: list[dict], stream: bool) -> tuple[str, str]:
    """(reply id, reply text) of one chat completion, streamed or not."""
    if not stream:
        reply = await client.chat.completions.create(model=MODEL, messages=messages, max_tokens=8)
        return reply.id, reply.choices[0].message.content
    chunks = await client.chat.completions.create(
        model=MODEL, messages=messages, max_tokens=8, stream=True
    )
    parts, reply_id = [], None
    async for chunk in chunks:
        reply_id = chunk.id
        if chunk.choices and chunk.choices[0].delta.content:
            parts.append(chunk.choices[0].delta.content)
    return reply_id, "".join(parts)


async def run_load(url: str, sessions: list[dict]) -> Load:
    load = Load()

    async def agent(index: int, session: dict) -> None:
        client = openai.AsyncOpenAI(
            base_url=url + "/v1", api_key=session["api_key"], max_retries=0, timeout=120
        )
        messages: list[dict] = []
        async with client:
            for call in range(CALLS_PER_SESSION):
                if len(messages) >= 2 * TURNS_PER_CONVERSATION:
                    messages = []
                messages.append({"role": "user", "content": f"step {call} of agent {index}"})
                stream = (index + call) % 3 == 0
                result = await call_with_backoff(
                    load, functools.partial(complete, client, messages, stream)
                )
                if result is None:
                    messages.pop()
                    continue
                reply_id, content = result
                load.acknowledged[session["session_id"]].add(reply_id)
                messages.append({"role": "assistant", "content": content})

    await asyncio.wait_for(
        asyncio.gather(*(agent(i, s) for i, s in enumerate(sessions))), timeout=600
    )
    return load


@pytest.fixture
def random_weights():
    """The shared worker serves random weights (same shapes: nothing recompiles) for this test:
    the tool-trained model answers most prompts with an immediate end of turn, random weights
    generate every requested token, so decoding is exercised under load."""
    worker = shared_worker()
    trained = (worker.sampler.params, worker.sampler.policy_version)
    random = nnx.state(init_model(worker.sampler.config, seed=1))
    worker.sampler.update_weights(random, trained[1] + 1)
    yield
    worker.sampler.update_weights(*trained)


@pytest.mark.slow
def test_32_sessions_x_16_calls_with_429_retries_all_recorded(tmp_path, random_weights):
    buffer = tmp_path / "buffer"
    with local_server(buffer, max_concurrent_requests=GATEWAY_LIMIT) as (thread, parts):
        sessions = []
        for i in range(SESSIONS):
            status, session = api(thread.url, "/rl/start_session", {"tenant": f"load{i % 2}"})
            assert status == 200
            sessions.append(session)
        load = asyncio.run(run_load(thread.url, sessions))
        assert load.failures == []  # no 5xx, no other error, no call given up
        acknowledged = sum(len(ids) for ids in load.acknowledged.values())
        assert acknowledged == SESSIONS * CALLS_PER_SESSION
        assert load.retried_429 > 0  # the limit was met: the retry path ran
        assert all(parts.worker.engine.status()[k] == 0 for k in ("running", "queued"))
        status, metrics = api(thread.url, "/metrics", key=None, method="GET")
        five_xx = [
            line
            for line in metrics.splitlines()
            if line.startswith("sao_gateway_requests_total") and 'status="5' in line
        ]
        assert five_xx == []
    print(
        f"\nload: {SESSIONS} sessions x {CALLS_PER_SESSION} calls = {acknowledged} acknowledged, "
        f"{load.retried_429} 429s retried, 0 5xx, 0 lost"
    )
    # every acknowledged response is in the buffer exactly once (read after the server is gone)
    stored = {**read_trajectories(buffer, "load0"), **read_trajectories(buffer, "load1")}
    stop_ids = shared_worker().tokenizer.stop_ids
    for session in sessions:
        events = stored[session["session_id"]].events
        ids = [e.metadata.interaction_id for e in events if e.kind == EventKind.LLM_CALL]
        assert sorted(ids) == sorted(load.acknowledged[session["session_id"]])
        for call in (e.llm for e in events if e.llm):  # 8 tokens, or fewer ending in a stop id
            assert call.output_ids.size == 8 or call.output_ids[-1] in stop_ids
        user_messages = [e for e in events if e.kind == EventKind.MESSAGE]
        assert len(user_messages) == len(ids)  # each turn's new user message, recorded once
