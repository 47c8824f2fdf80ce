"""reasoning_effort as a thinking budget: a slot counts the tokens it thinks (between <think>
and </think>) and, once the budget is spent, allows only </think>; budget 0 never opens
<think>. The masks are checked bit by bit, then a real engine run with a forced budget."""

import asyncio

import numpy as np
import pytest
from serving_harness import tool_model

from serving.common.tiny_tokenizer import build_tiny_tokenizer
from serving.worker.config import WorkerConfig
from serving.worker.generation import GenerationHandle, GenerationRequest, TextTracker
from serving.worker.service import Worker
from serving.worker.slots import Slot

TOKENIZER = build_tiny_tokenizer()
OPEN, CLOSE = TOKENIZER.token_to_id("<think>"), TOKENIZER.token_to_id("</think>")
WORDS = (TOKENIZER.vocab_size + 31) // 32


def allowed(mask: np.ndarray) -> set[int]:
    bits = np.unpackbits(mask.view(np.uint8), bitorder="little")
    return set(np.flatnonzero(bits[: TOKENIZER.vocab_size]).tolist())


def slot(budget: int | None) -> Slot:
    request = GenerationRequest(input_ids=(1, 2), max_tokens=50, think_budget=budget)
    loop = asyncio.new_event_loop()
    handle = GenerationHandle(request, loop)
    loop.close()
    stop_ids = frozenset(TOKENIZER.stop_ids)
    made = Slot(handle, stop_ids, TextTracker(TOKENIZER, (), stop_ids), admitted_at=0.0)
    made.start_budget((OPEN, CLOSE))
    return made


def test_budget_forces_the_end_of_thinking():
    s = slot(3)
    assert s.next_mask(WORDS) is None and not s.needs_single_steps(4)
    s.extend([OPEN, 40], [-1.0, -1.0], 0, [-1.0, -1.0])
    assert s.thinking == 1 and s.next_mask(WORDS) is None
    assert s.needs_single_steps(4) and not s.needs_single_steps(2)
    s.extend([41, 42], [-1.0] * 2, 0, [-1.0] * 2)
    assert allowed(s.next_mask(WORDS)) == {CLOSE}
    s.extend([CLOSE], [-1.0], 0, [0.0])
    assert s.thinking is None and s.next_mask(WORDS) is None


@pytest.mark.parametrize("budget", [0])
def test_budget_zero_never_opens_think(budget):
    s = slot(budget)
    assert allowed(s.next_mask(WORDS)) == set(range(TOKENIZER.vocab_size)) - {OPEN}
    assert s.needs_single_steps(1)
    assert slot(None).next_mask(WORDS) is None


def test_engine_closes_thinking_at_the_budget():
    """A prompt that opens <think> (as thinking templates do): the reply thinks at most 2
    tokens, then </think> is forced, whatever the model wanted; without a budget the random
    model goes on. No stop ids, so a random model cannot end the reply before the budget."""
    worker = Worker(WorkerConfig(num_slots=2, context_length=512, decode_steps=4), tool_model())
    worker.start()
    engine = worker.engine
    prompt = [*TOKENIZER.encode_chat([{"role": "user", "content": "think"}]), OPEN]

    async def run(seed, budget):
        request = GenerationRequest(
            input_ids=tuple(prompt),
            max_tokens=8,
            seed=seed,
            think_budget=budget,
            stop_token_ids=(),
        )
        ids = []
        async for event in engine.submit(request).events():
            ids += getattr(event, "token_ids", [])
        return ids

    try:
        for seed in range(3):
            ids = asyncio.run(run(seed, 2))
            assert len(ids) == 8 and max(thought(ids)) <= 2 and CLOSE in ids, ids
        free = [asyncio.run(run(seed, None)) for seed in range(3)]
        assert any(max(thought(ids)) > 2 for ids in free)
    finally:
        worker.stop()


def thought(ids: list[int]) -> list[int]:
    """Tokens thought so far after each output token (0 once outside <think>); the prompt
    opened the block."""
    thinking, counts = 0, []
    for token in ids:
        if token == OPEN:
            thinking = 0
        elif token == CLOSE:
            thinking = None
        elif thinking is not None:
            thinking += 1
        counts.append(thinking or 0)
    return counts
