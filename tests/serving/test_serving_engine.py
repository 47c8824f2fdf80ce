"""The worker's continuous-batching engine: batch-invariant outputs with exact log-probs, hot
weight swaps without dropped requests, pause / continue, staleness 429s, cancellation, stop
strings, top log-probs."""

import asyncio
import dataclasses

import jax
import numpy as np
import pytest
from flax import nnx
from serving_harness import TOOL_MESSAGES, TOOL_REPLY, WEATHER_TOOL, tool_model

from sao_jax.models import init_model
from sao_jax.rollout import Sampler
from serving.common.errors import ApiError
from serving.worker.config import WorkerConfig
from serving.worker.generation import Finished, GenerationRequest, TokenChunk
from serving.worker.service import Worker

CONFIG = WorkerConfig(num_slots=4, context_length=512, decode_steps=4, max_prefill_batch=4)


@pytest.fixture(scope="module")
def sampler():
    served = tool_model()
    return Sampler(served.model, pad_id=served.tokenizer.pad_id)


@pytest.fixture
def make_worker(sampler):
    """Workers sharing the module's sampler (compiled once); weights restored afterwards."""
    workers, original = [], (sampler.params, sampler.policy_version)

    def make(**overrides) -> Worker:
        worker = Worker(dataclasses.replace(CONFIG, **overrides), tool_model(), sampler=sampler)
        worker.start()
        workers.append(worker)
        return worker

    yield make
    for worker in workers:
        worker.stop()
    sampler.update_weights(*original)


@pytest.fixture(scope="module")
def full_logprobs(sampler):
    """Teacher-forced log-probs [T, V] of a whole sequence under given params (the reference
    the recorded log-probs must equal)."""

    @jax.jit
    def run(params, tokens):
        return jax.nn.log_softmax(nnx.merge(sampler.graphdef, params)(tokens), axis=-1)

    def logprobs(params, sequence):
        tokens = np.zeros((1, 512), np.int32)
        tokens[0, : len(sequence)] = sequence
        return np.asarray(run(params, tokens))[0]

    return logprobs


async def collect(worker: Worker, request: GenerationRequest):
    chunks, finished = [], None
    async for event in worker.submit(request).events():
        if isinstance(event, Finished):
            finished = event
        else:
            chunks.append(event)
    ids = [t for c in chunks for t in c.token_ids]
    logprobs = [lp for c in chunks for lp in c.logprobs]
    versions = [v for c in chunks for v in c.versions]
    return ids, logprobs, versions, "".join(c.text for c in chunks), finished, chunks


def prompts():
    tok = tool_model().tokenizer
    texts = ["hi", "go to the cabinet", "What is the weather?", "x", "open the fridge 2", "ok"]
    return [tok.encode_chat([{"role": "user", "content": t}]) for t in texts]


def test_concurrent_outputs_equal_solo_outputs_with_exact_logprobs(
    make_worker, sampler, full_logprobs
):
    worker = make_worker()

    def request(i, prompt):
        return GenerationRequest(
            tuple(prompt), max_tokens=12 + 5 * i, seed=100 + i, top_k=50 * (i % 2)
        )

    async def together():
        first = [
            asyncio.create_task(collect(worker, request(i, p))) for i, p in enumerate(prompts()[:3])
        ]
        await asyncio.sleep(
            0.05
        )  # the rest arrive while the first ones decode (4 slots, 6 requests)
        rest = [collect(worker, request(i + 3, p)) for i, p in enumerate(prompts()[3:])]
        return await asyncio.gather(*first, *rest)

    batched = asyncio.run(together())
    for i, prompt in enumerate(prompts()):
        alone = asyncio.run(collect(worker, request(i, prompt)))
        ids, logprobs, versions, text, finished, _ = batched[i]
        assert ids == alone[0] and np.allclose(logprobs, alone[1], atol=1e-5)
        assert finished.finish_reason in ("stop", "length") and finished.completion_tokens == len(
            ids
        )
        assert text == finished.text and set(versions) == {0}
        reference = full_logprobs(sampler.params, prompt + ids)
        expected = [reference[len(prompt) + j - 1, t] for j, t in enumerate(ids)]
        np.testing.assert_allclose(logprobs, expected, atol=2e-4)
    assert worker.engine.status()["running"] == 0


def test_weight_swap_mid_generation_drops_nothing_and_stamps_versions(
    make_worker, sampler, full_logprobs
):
    worker = make_worker()
    old = sampler.params
    new = nnx.state(init_model(sampler.config, seed=7))
    prompt = prompts()[1]
    request = GenerationRequest(tuple(prompt), max_tokens=160, seed=5, stop_token_ids=())

    async def run():
        neighbour = asyncio.create_task(collect(worker, dataclasses.replace(request, seed=6)))
        ids, logprobs, versions, update = [], [], [], None
        async for event in worker.submit(request).events():
            if isinstance(event, TokenChunk):
                ids += event.token_ids
                logprobs += event.logprobs
                versions += event.versions
                if update is None:
                    update = asyncio.ensure_future(worker.update_weights(new, 1))
            else:
                finished = event
        return ids, logprobs, versions, finished, await update, await neighbour

    ids, logprobs, versions, finished, applied, neighbour = asyncio.run(run())
    assert applied == 1 and worker.engine.status()["policy_version"] == 1
    assert finished.finish_reason == "length" and len(ids) == 160
    switch = versions.index(1)
    assert 0 < switch < 160 and versions == [0] * switch + [1] * (160 - switch)
    assert neighbour[4].finish_reason == "length" and len(neighbour[0]) == 160  # not dropped
    # Tokens before the swap are the old policy's; after it (re-prefilled caches) exactly the
    # new policy's, so DIS ratios against the recorded log-probs are exact.
    before = full_logprobs(old, prompt + ids)
    after = full_logprobs(new, prompt + ids)
    expected = [
        (before if j < switch else after)[len(prompt) + j - 1, t] for j, t in enumerate(ids)
    ]
    np.testing.assert_allclose(logprobs, expected, atol=2e-4)


def test_kv_written_while_weights_are_swapped_outside_the_engine_is_not_reused(
    make_worker, sampler, full_logprobs, monkeypatch
):
    """Weights swapped by a direct `Sampler.update_weights` from another thread while a
    prefill runs (not through the engine, which swaps between dispatches): the slot's KV is of
    the old weights, so the next request with that prompt must not reuse it -- its log-probs
    are exactly the new weights'."""
    worker = make_worker()
    new = nnx.state(init_model(sampler.config, seed=11))
    real_prefill, swapped = sampler.prefill, []

    def prefill_then_swap(*args, **kwargs):  # the swap lands while this call is "running"
        out = real_prefill(*args, **kwargs)
        if not swapped:
            sampler.update_weights(new, 1)
            swapped.append(True)
        return out

    monkeypatch.setattr(sampler, "prefill", prefill_then_swap)
    prompt = prompts()[2]
    request = GenerationRequest(tuple(prompt), max_tokens=6, seed=3, stop_token_ids=())
    asyncio.run(collect(worker, request))
    cached_before = worker.engine.cached_tokens
    ids, logprobs, *_ = asyncio.run(collect(worker, dataclasses.replace(request, seed=4)))
    assert swapped and worker.engine.cached_tokens == cached_before  # nothing reused
    reference = full_logprobs(new, prompt + ids)
    expected = [reference[len(prompt) + j - 1, t] for j, t in enumerate(ids)]
    np.testing.assert_allclose(logprobs, expected, atol=2e-4)


def test_a_restarted_engine_reuses_no_kv_from_before_its_stop(make_worker, sampler, full_logprobs):
    """`stop` then `start` (a server restarted on the same worker) begins with an empty KV
    cache: a prompt sharing a prefix with one served before the stop is encoded whole, and its
    log-probs are exactly the model's (reusing the forgotten prefix gave errors of ~1 nat)."""
    worker = make_worker()
    tok = tool_model().tokenizer
    first = tok.encode_chat([{"role": "user", "content": "hi"}])
    second = tok.encode_chat(TOOL_MESSAGES)  # shares the user turn's opening tokens
    assert first[:3] == second[:3]
    asyncio.run(collect(worker, GenerationRequest(tuple(first), max_tokens=3, seed=1)))
    worker.stop()
    worker.start()
    cached_before = worker.engine.cached_tokens
    request = GenerationRequest(tuple(second), max_tokens=8, seed=2, stop_token_ids=())
    ids, logprobs, *_ = asyncio.run(collect(worker, request))
    assert worker.engine.cached_tokens == cached_before  # nothing reused across the restart
    reference = full_logprobs(sampler.params, second + ids)
    expected = [reference[len(second) + j - 1, t] for j, t in enumerate(ids)]
    np.testing.assert_allclose(logprobs, expected, atol=2e-4)


def test_pause_queues_and_continue_resumes(make_worker):
    worker = make_worker()

    async def run():
        worker.engine.pause()
        task = asyncio.create_task(
            collect(worker, GenerationRequest(tuple(prompts()[0]), max_tokens=8, seed=1))
        )
        await asyncio.sleep(0.3)
        status = worker.engine.status()
        assert status["paused"] and status["queued"] == 1 and not task.done()
        worker.engine.resume()
        return await task

    ids, *_, finished, _ = asyncio.run(run())
    assert finished.finish_reason in ("stop", "length") and ids


def test_warmup_with_more_prefill_batch_than_slots_compiles_and_serves(make_worker):
    # a prefill never takes more requests than there are slots: warm-up must not try to either
    worker = make_worker(num_slots=2, max_prefill_batch=8, context_length=64, warmup=True)
    assert worker._warmed
    requests = [GenerationRequest(tuple(p), max_tokens=4, seed=3) for p in prompts()[:3]]

    async def run():
        return await asyncio.gather(*(collect(worker, r) for r in requests))

    for ids, *_, finished, _ in asyncio.run(run()):
        assert finished.finish_reason in ("stop", "length") and ids


def test_staleness_capacity_answers_429_until_new_weights(make_worker, sampler):
    worker = make_worker(max_staleness=0, staleness_batch_size=2)
    request = GenerationRequest(tuple(prompts()[0]), max_tokens=4, seed=2)

    async def run():
        for _ in range(2):
            await collect(worker, request)
        with pytest.raises(ApiError) as info:
            worker.submit(request)
        assert info.value.status == 429 and info.value.code == "staleness_capacity_exhausted"
        assert info.value.headers["Retry-After"] == "1"
        await worker.update_weights(sampler.params, sampler.policy_version + 1)
        return await collect(worker, request)

    *_, finished, _ = asyncio.run(run())
    assert finished.finish_reason in ("stop", "length")
    assert worker.metrics.rejected.labels("staleness")._value.get() == 1


def test_cancel_and_timeout_free_the_slot(make_worker):
    worker = make_worker()
    long = GenerationRequest(tuple(prompts()[0]), max_tokens=400, seed=3, stop_token_ids=())

    async def run():
        handle = worker.submit(long)
        async for event in handle.events():
            assert isinstance(event, TokenChunk)
            break  # leaving the iterator cancels the generation
        timed = await collect(worker, dataclasses.replace(long, timeout_s=0.05))
        for _ in range(100):
            if worker.engine.status()["running"] == 0:
                break
            await asyncio.sleep(0.02)
        return timed

    *_, finished, _ = asyncio.run(run())
    assert finished.finish_reason == "timeout" and finished.completion_tokens < 400
    assert worker.engine.status()["running"] == 0
    assert worker.metrics.finished.labels("cancelled")._value.get() == 1


def test_stop_string_ends_reply_and_deactivates_slot(make_worker):
    worker = make_worker()
    tok = tool_model().tokenizer
    prompt = tok.encode_chat(TOOL_MESSAGES, tools=[WEATHER_TOOL])
    request = GenerationRequest(
        tuple(prompt), max_tokens=60, temperature=0.0, stop=('"arguments"',)
    )
    ids, _, _, text, finished, _ = asyncio.run(collect(worker, request))
    assert finished.finish_reason == "stop" and finished.stop_reason == '"arguments"'
    # cut at the last token boundary before the stop string (the ' "' token straddles its
    # start), so the reply text is exactly the decode of the kept ids
    assert text == tok.decode(ids) == TOOL_REPLY[: TOOL_REPLY.index(' "arguments"')]
    assert '"arguments"' not in tok.decode(ids) and len(ids) < len(tok.encode(TOOL_REPLY))
    assert worker.engine.status()["running"] == 0


def test_top_logprobs_are_the_model_top_k(make_worker, sampler, full_logprobs):
    worker = make_worker()
    prompt = prompts()[2]
    request = GenerationRequest(tuple(prompt), max_tokens=10, seed=9, top_logprobs=5)
    ids, logprobs, _, _, _, chunks = asyncio.run(collect(worker, request))
    top = [row for c in chunks for row in c.top_logprobs]
    reference = full_logprobs(sampler.params, prompt + ids)
    for j, row in enumerate(top):
        expected = np.argsort(-reference[len(prompt) + j - 1])[:5]
        assert [i for i, _ in row] == expected.tolist()
        np.testing.assert_allclose(
            [v for _, v in row], reference[len(prompt) + j - 1, expected], atol=2e-4
        )
        if ids[j] == row[0][0]:
            assert abs(logprobs[j] - row[0][1]) < 2e-4


def test_requests_the_cache_cannot_hold_are_refused(make_worker):
    worker = make_worker()

    async def submit(request):
        return worker.submit(request)

    with pytest.raises(ApiError) as info:
        asyncio.run(submit(GenerationRequest((1,) * 500, max_tokens=20)))
    assert info.value.status == 400 and info.value.code == "context_length_exceeded"


def test_a_reply_continued_after_a_worker_died_keeps_its_grammar_and_held_back_text(make_worker):
    """What the data proxy sends when a reply moves: the reply so far as `continues` (the tail
    of the prompt) and the characters already delivered. The grammar resumes where it was
    (a fresh one would restart the reply), and text held back for a stop string is sent."""
    worker = make_worker()
    tok = tool_model().tokenizer
    prompt = tuple(tok.encode_chat([{"role": "user", "content": "go to the cabinet"}]))
    options = ["go to desk 1", "go to cabinet 12", "look around"]
    grammar = "start: " + " | ".join(f'"{o}"' for o in options)
    whole = GenerationRequest(prompt, max_tokens=24, temperature=0.0, grammar=grammar)
    ids, _, _, text, finished, _ = asyncio.run(collect(worker, whole))
    assert text in options and finished.finish_reason == "stop" and len(ids) >= 3
    for cut in range(1, len(ids) - 1):
        done = tok.decode(ids[:cut])
        moved = dataclasses.replace(
            whole,
            input_ids=prompt + tuple(ids[:cut]),
            max_tokens=whole.max_tokens - cut,
            continues=tuple(ids[:cut]),
            continued_chars=len(done),
        )
        rest, _, _, rest_text, _, _ = asyncio.run(collect(worker, moved))
        assert ids[:cut] + rest == ids and done + rest_text == text, cut
    # a stop string's possible start held back when the first worker died is delivered now
    held = tok.decode(ids[:1])[:-1]  # as if the last character could start a stop string
    moved = dataclasses.replace(
        whole,
        input_ids=prompt + tuple(ids[:1]),
        max_tokens=whole.max_tokens - 1,
        continues=tuple(ids[:1]),
        continued_chars=len(held),
    )
    _, _, _, rest_text, _, _ = asyncio.run(collect(worker, moved))
    assert held + rest_text == text
    with pytest.raises(ValueError, match="tail of input_ids"):
        dataclasses.replace(whole, continues=(1, 2, 3))
