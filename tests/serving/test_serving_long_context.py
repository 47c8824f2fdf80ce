"""Long contexts in the worker: the `tiny_64k` preset advertises 65,536 positions, the KV cache
grows to the requests served, long prompts are prefilled in chunks, a re-sent prefix is taken
from a slot's cache (greedy outputs identical to encoding it again; only the new suffix is
encoded), and `max_completion_tokens` clamps an agent's max_tokens = context."""

import asyncio
import dataclasses
import json
import time

import numpy as np
import pytest
from serving_harness import local_server, read_trajectories, session_client

from atdp_io import EventKind
from sao_jax.rollout import Sampler
from serving.common.errors import ApiError
from serving.common.model_source import load_served_model
from serving.worker.config import WorkerConfig
from serving.worker.generation import Finished, GenerationRequest
from serving.worker.prefix_cache import common_prefix
from serving.worker.service import Worker

CONFIG = WorkerConfig(preset="tiny_64k", num_slots=2, decode_steps=4)


@pytest.fixture(scope="module")
def served():
    return load_served_model(config_name="tiny_64k")


@pytest.fixture(scope="module")
def sampler(served):
    return Sampler(served.model, pad_id=served.tokenizer.pad_id)


@pytest.fixture
def make_worker(served, sampler):
    """Started workers sharing the module's sampler (its kernels compile once)."""
    workers, original = [], (sampler.params, sampler.policy_version)

    def make(**overrides) -> Worker:
        worker = Worker(dataclasses.replace(CONFIG, **overrides), served, sampler=sampler)
        worker.start()
        workers.append(worker)
        return worker

    yield make
    for worker in workers:
        worker.stop()
    sampler.update_weights(*original)


def generate(worker: Worker, prompt: list[int], max_tokens: int = 6):
    """Greedy, no stop ids: (token ids, log-probs, finish reason)."""

    async def run():
        request = GenerationRequest(
            input_ids=tuple(prompt), max_tokens=max_tokens, temperature=0.0, stop_token_ids=()
        )
        ids, logprobs, finished = [], [], None
        async for event in worker.submit(request).events():
            if isinstance(event, Finished):
                finished = event
            else:
                ids += event.token_ids
                logprobs += event.logprobs
        return ids, np.asarray(logprobs), finished.finish_reason

    return asyncio.run(run())


def random_prompt(length: int, seed: int) -> list[int]:
    return np.random.default_rng(seed).integers(3, 500, length).tolist()


def test_common_prefix():
    a = np.array([1, 2, 3, 4])
    assert common_prefix(a, np.array([1, 2, 9])) == 2
    assert common_prefix(a, np.array([1, 2])) == 2
    assert common_prefix(a, np.array([], np.int64)) == 0
    assert common_prefix(a, a) == 4


def test_tiny_64k_advertises_65536_positions_and_starts_with_a_small_cache(make_worker):
    worker = make_worker()
    assert worker.info()["context_length"] == 65_536
    assert worker.engine.cache_length == 4096  # grown on demand, not 2 x 64K positions up front
    # a request over the context is still refused, naming the limit
    request = GenerationRequest(input_ids=(5,) * 60_000, max_tokens=6_000)
    with pytest.raises(ApiError, match="context is 65536 tokens") as error:
        worker.engine.validate(request)
    assert error.value.code == "context_length_exceeded"


def test_chunked_prefill_of_a_long_prompt_matches_one_dispatch(make_worker):
    prompt = random_prompt(5000, seed=1)
    chunked = make_worker(prefill_chunk=1024, prefix_cache=False)
    ids, logprobs, reason = generate(chunked, prompt)
    assert chunked.engine.cache_length == 8192  # grew to the bucket holding 5000 + 6
    assert chunked.engine.prefill_tokens == 5000 and reason == "length"
    whole = make_worker(prefill_chunk=8192, prefix_cache=False)
    ids_whole, logprobs_whole, _ = generate(whole, prompt)
    assert ids == ids_whole
    np.testing.assert_allclose(logprobs, logprobs_whole, atol=2e-4)


def test_other_slots_decode_while_a_long_prompt_is_read_chunk_by_chunk(make_worker):
    worker = make_worker(prefill_chunk=256, prefix_cache=False)

    async def run():
        async def timed(prompt: list[int], max_tokens: int) -> tuple[float, float]:
            request = GenerationRequest(
                input_ids=tuple(prompt), max_tokens=max_tokens, temperature=0.0, stop_token_ids=()
            )
            first = None
            async for event in worker.submit(request).events():
                first = first or time.monotonic()
                if isinstance(event, Finished):
                    return first, time.monotonic()

        long = asyncio.create_task(timed(random_prompt(3000, seed=7), 4))
        await asyncio.sleep(0.05)  # the long prompt is admitted first
        short = asyncio.create_task(timed(random_prompt(20, seed=8), 4))
        return await long, await short

    (long_first, _), (_, short_done) = asyncio.run(run())
    # 12 chunks of 256 tokens: the short reply is complete before the long one's first token
    assert short_done < long_first


def test_a_resent_prefix_is_encoded_once_with_identical_outputs(make_worker):
    cached = make_worker()
    first_prompt = random_prompt(600, seed=2)
    first, _, _ = generate(cached, first_prompt)
    # the next turn re-sends the conversation: the previous prompt, the reply, 40 new tokens
    turn = first_prompt + first + random_prompt(40, seed=3)
    before = cached.engine.prefill_tokens
    ids, logprobs, _ = generate(cached, turn)
    # the reply's last token was sampled but never written to the cache: it is encoded again
    assert cached.engine.prefill_tokens - before == 1 + 40
    assert cached.engine.cached_tokens == len(turn) - 41
    uncached = make_worker(prefix_cache=False)
    ids_uncached, logprobs_uncached, _ = generate(uncached, turn)
    assert uncached.engine.prefill_tokens == len(turn)
    assert ids == ids_uncached
    np.testing.assert_allclose(logprobs, logprobs_uncached, atol=2e-4)

    # another conversation goes to the other (empty) slot, keeping the first one's prefix
    other = random_prompt(300, seed=4)
    before = cached.engine.prefill_tokens
    generate(cached, other)
    assert cached.engine.prefill_tokens - before == 300
    before = cached.engine.prefill_tokens
    assert generate(cached, turn)[0] == ids
    assert cached.engine.prefill_tokens - before == 1  # all but the last prompt token cached


def test_new_weights_invalidate_the_cached_prefixes(make_worker, sampler):
    worker = make_worker()
    prompt = random_prompt(200, seed=5)
    generate(worker, prompt)
    asyncio.run(worker.update_weights(sampler.params, 1))
    before = worker.engine.prefill_tokens
    generate(worker, prompt)
    assert worker.engine.prefill_tokens - before == 200  # keys / values of the old weights


def test_max_completion_tokens_clamps_a_request_for_the_whole_context(make_worker):
    worker = make_worker(max_completion_tokens=5)
    ids, _, reason = generate(worker, random_prompt(100, seed=6), max_tokens=65_536 - 100)
    assert len(ids) == 5 and reason == "length"
    assert worker.info()["max_completion_tokens"] == 5


def test_an_agent_asking_for_the_whole_context_is_served_and_recorded(tmp_path, served, sampler):
    config = dataclasses.replace(CONFIG, max_completion_tokens=6)
    worker = Worker(config, served, sampler=sampler)
    with local_server(tmp_path, worker=worker, worker_config=config) as (thread, _):
        session_id, client = session_client(thread.url)
        model = client.models.list().data[0]
        assert model.context_length == 65_536
        reply = client.chat.completions.create(
            model=model.id,
            messages=[{"role": "user", "content": "hello " * 50}],
            max_tokens=65_536,  # what Hermes Agent sends: the advertised context
            temperature=0.0,
        )
        assert reply.usage.completion_tokens <= 6
        if reply.choices[0].finish_reason == "length":
            assert reply.usage.completion_tokens == 6
    events = read_trajectories(tmp_path, "acme")[session_id].events
    calls = [event for event in events if event.kind == EventKind.LLM_CALL]
    assert len(calls) == 1
    decoding = calls[0].llm.decoding
    assert decoding.max_tokens == 6
    assert decoding.extra["requested_max_tokens"] == 65_536
    assert decoding.extra["max_tokens_clamped"] is True
    json.dumps(decoding.extra)  # recorded as plain JSON
