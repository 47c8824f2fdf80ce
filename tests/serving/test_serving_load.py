"""Load on loopback: 500 completions over 32 concurrent multi-turn sessions (a third of them
streamed). No 5xx, and every acknowledged response has exactly one durable ATDP event."""

import asyncio
import collections

import openai
import pytest
from flax import nnx
from serving_harness import api, local_server, read_trajectories, shared_worker

from atdp_io import EventKind
from sao_jax.models import init_model

MODEL = "sao-test"
SESSIONS = 32
REQUESTS = 500
TURNS_PER_CONVERSATION = 6  # then the agent starts a fresh conversation in the same session


async def run_load(url: str, sessions: list[dict]) -> tuple[dict, list]:
    acknowledged: dict[str, set[str]] = collections.defaultdict(set)
    failures: list = []
    budget = iter(range(REQUESTS))  # the loops stop by themselves after REQUESTS calls

    async def agent(index: int, session: dict) -> None:
        client = openai.AsyncOpenAI(
            base_url=url + "/v1", api_key=session["api_key"], max_retries=0, timeout=120
        )
        messages: list[dict] = []
        async with client:
            for request_number in budget:
                if len(messages) >= 2 * TURNS_PER_CONVERSATION:
                    messages = []
                messages.append(
                    {"role": "user", "content": f"step {request_number} of agent {index}"}
                )
                try:
                    if request_number % 3 == 0:
                        stream = await client.chat.completions.create(
                            model=MODEL, messages=messages, max_tokens=8, stream=True
                        )
                        parts, reply_id = [], None
                        async for chunk in stream:
                            reply_id = chunk.id
                            if chunk.choices and chunk.choices[0].delta.content:
                                parts.append(chunk.choices[0].delta.content)
                        content = "".join(parts)
                    else:
                        reply = await client.chat.completions.create(
                            model=MODEL, messages=messages, max_tokens=8
                        )
                        reply_id, content = reply.id, reply.choices[0].message.content
                except openai.APIError as error:
                    failures.append((request_number, repr(error)))
                    messages.pop()
                    continue
                acknowledged[session["session_id"]].add(reply_id)
                messages.append({"role": "assistant", "content": content})

    await asyncio.wait_for(
        asyncio.gather(*(agent(i, s) for i, s in enumerate(sessions))), timeout=600
    )
    return acknowledged, failures


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
def test_500_requests_over_32_sessions_all_recorded(tmp_path, random_weights):
    buffer = tmp_path / "buffer"
    with local_server(buffer) as (thread, parts):
        sessions = []
        for i in range(SESSIONS):
            status, session = api(thread.url, "/rl/start_session", {"tenant": f"load{i % 2}"})
            assert status == 200
            sessions.append(session)
        acknowledged, failures = asyncio.run(run_load(thread.url, sessions))
        assert failures == []
        assert sum(len(ids) for ids in acknowledged.values()) == REQUESTS
        assert all(parts.worker.engine.status()[k] == 0 for k in ("running", "queued"))
    # every acknowledged response is in the buffer exactly once (read after the server is gone)
    stored = {**read_trajectories(buffer, "load0"), **read_trajectories(buffer, "load1")}
    stop_ids = shared_worker().tokenizer.stop_ids
    for session in sessions:
        events = stored[session["session_id"]].events
        ids = [e.metadata.interaction_id for e in events if e.kind == EventKind.LLM_CALL]
        assert sorted(ids) == sorted(acknowledged[session["session_id"]])
        for call in (e.llm for e in events if e.llm):  # 8 tokens, or fewer ending in a stop id
            assert call.output_ids.size == 8 or call.output_ids[-1] in stop_ids
        user_messages = [e for e in events if e.kind == EventKind.MESSAGE]
        assert len(user_messages) == len(ids)  # each turn's new user message, recorded once
