"""Token masks of constrained calls, from the record to batches: the replay rebuilds the
serving worker's masks bit for bit (grammars: real llguidance, the tiny tokenizer, the proxy's
own grammars; thinking budgets: the worker's own `Slot`), rows leave forced tokens out of the
loss and carry each distinct mask once, and a grammar that does not accept its tokens is named
and skipped, the rest loading."""

import asyncio
import dataclasses
import logging

import grain
import numpy as np
import pytest
from atdp_factories import NOW, env_event, llm_event

from atdp_io import AtdpStore, Outcome, Trajectory, TrajectoryHeader, trained_on
from atdp_io.governance import Governance
from atdp_io.loader import AtdpLoader, LoaderConfig
from atdp_io.mask_replay import MaskReplay
from atdp_io.rows import (
    SAMPLING_KEYS,
    LLMTurn,
    TrainingView,
    pack_batch,
    training_view,
    trajectory_rows,
)
from atdp_io.schema import DecodingParams
from atdp_io.token_masks import MASK_KEYS, ConstraintReplayError, allowed_count, call_constraint
from serving.common.openai_requests import parse_chat_request
from serving.common.tiny_tokenizer import build_tiny_tokenizer
from serving.proxy.grammars import output_grammar
from serving.worker.constraints import GrammarCompiler
from serving.worker.generation import GenerationHandle, GenerationRequest, TextTracker
from serving.worker.slots import Slot

TOKENIZER = build_tiny_tokenizer()
VOCAB = TOKENIZER.vocab_size
STOPS = tuple(TOKENIZER.stop_ids)
WORKER = GrammarCompiler(TOKENIZER.backend.to_str(), VOCAB, STOPS)
REPLAY = MaskReplay.from_tokenizer(TOKENIZER, VOCAB)
LAMP = {
    "type": "function",
    "function": {
        "name": "set_lamp",
        "parameters": {
            "type": "object",
            "properties": {"on": {"type": "boolean"}, "room": {"enum": ["hall", "den"]}},
            "required": ["on", "room"],
            "additionalProperties": False,
        },
    },
}
NOTE = {"type": "function", "function": {"name": "note", "parameters": {}}}
ANSWER = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}


def grammar_of(**fields) -> str:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], **fields}
    request = parse_chat_request(body)
    return output_grammar(request, request.tools, TOKENIZER)


GRAMMARS = {
    "required": grammar_of(tools=[LAMP, NOTE], tool_choice="required"),
    "named": grammar_of(
        tools=[LAMP, NOTE], tool_choice={"type": "function", "function": {"name": "set_lamp"}}
    ),
    "json_schema": grammar_of(
        response_format={"type": "json_schema", "json_schema": {"name": "a", "schema": ANSWER}}
    ),
    "json_object_or_call": grammar_of(tools=[LAMP], response_format={"type": "json_object"}),
}


def walk(grammar: str, seed: int, limit: int = 48) -> tuple[list[int], list[np.ndarray]]:
    """A reply sampled uniformly under the worker's own masks (to a stop token, or cut at
    `limit` like max_tokens): (its ids, the worker's mask before each)."""
    constraint, rng = WORKER.compile(grammar), np.random.default_rng(seed)
    ids, masks = [], []
    for _ in range(limit):
        mask = constraint.bitmask()
        bits = np.unpackbits(mask.view(np.uint8), bitorder="little")[:VOCAB]
        token = int(rng.choice(np.flatnonzero(bits)))
        ids.append(token)
        masks.append(mask)
        constraint.consume(token)
        if token in STOPS:
            break
    return ids, masks


@pytest.mark.parametrize("name", sorted(GRAMMARS))
@pytest.mark.parametrize("seed", [0, 1])
def test_the_replay_rebuilds_the_worker_masks_bit_for_bit(name, seed):
    ids, worker_masks = walk(GRAMMARS[name], seed)
    constraint = call_constraint({"grammar": GRAMMARS[name], "stop_token_ids": list(STOPS)}, "t")
    masks = REPLAY.grammar_masks(constraint, np.asarray(ids, np.int32), "t")
    for i, worker in enumerate(worker_masks):
        if allowed_count(worker) == 1:
            assert masks.forced[i] and masks.index[i] == -1
        else:
            assert not masks.forced[i]
            np.testing.assert_array_equal(masks.table[masks.index[i]], worker)
    assert masks.forced.any() and (masks.index >= 0).any()
    # each distinct mask is stored once
    assert len({m.tobytes() for m in masks.table}) == masks.table.shape[0]
    assert masks.table.shape == (masks.table.shape[0], (VOCAB + 31) // 32)


def _constrained(trajectory_id: str, grammars, seed: int):
    """A concat trajectory: per grammar (None: a free call) an LLM call then an env step,
    each input extending the last. A constrained reply walks its grammar and records it, as
    the serving proxy does; every call records sampled log-probs (0 where forced)."""
    rng = np.random.default_rng(seed)
    context = rng.integers(3, 250, 10).astype(np.int32)
    events = []
    for turn, grammar in enumerate(grammars):
        extra = {}
        if grammar is None:
            output = rng.integers(3, 250, 5).astype(np.int32)
            sampled = [-0.5] * 5
        else:
            ids, masks = walk(grammar, seed + turn)
            output = np.asarray(ids, np.int32)
            sampled = [0.0 if allowed_count(m) == 1 else -0.5 for m in masks]
            extra = {"grammar": grammar, "stop_token_ids": list(STOPS)}
        event = llm_event(context, output, rng=rng)
        decoding = DecodingParams(extra={**extra, "sampled_logprobs": sampled})
        llm = dataclasses.replace(event.llm, decoding=decoding)
        events += [dataclasses.replace(event, llm=llm), env_event(f"obs {turn}", "cmd", 1.0)]
        context = np.concatenate([context, output, rng.integers(3, 250, 3).astype(np.int32)])
    header = TrajectoryHeader(
        trajectory_id=trajectory_id,
        governance=Governance.synthetic("acme", expires_at=NOW + 86400),
        created_at=NOW,
    )
    return Trajectory(header=header, events=tuple(events), outcome=Outcome(success=True))


def _regrammar(trajectory: Trajectory, event: int, grammar: str) -> Trajectory:
    """`trajectory` with LLM event `event` claiming another grammar than it was sampled under."""
    events = list(trajectory.events)
    llm = events[event].llm
    extra = {**llm.decoding.extra, "grammar": grammar}
    decoding = dataclasses.replace(llm.decoding, extra=extra)
    events[event] = dataclasses.replace(
        events[event], llm=dataclasses.replace(llm, decoding=decoding)
    )
    return dataclasses.replace(trajectory, events=tuple(events))


@pytest.mark.parametrize("layout", ["concat", "windowed"])
def test_rows_leave_forced_tokens_out_and_carry_each_mask(layout):
    grammars = [GRAMMARS["required"], None, GRAMMARS["required"]]
    view = REPLAY.view(training_view(_constrained("c", grammars, seed=3)))
    rows, _ = trajectory_rows(view, layout)
    batch = pack_batch([rows], len(rows), 256)
    assert set(SAMPLING_KEYS) | set(MASK_KEYS) <= set(batch)
    # temperature 1 unfiltered: the transform is the identity, the mask is all there is
    assert np.all(batch["sample_temperature"] == 1.0) and np.all(batch["sample_top_k"] == 0)
    table = batch["mask_table"]
    _, m, words = table.shape
    assert words == (VOCAB + 31) // 32 and m & (m - 1) == 0  # a power of two
    for call, turn in enumerate(view.turns):
        row = 0 if layout == "concat" else call
        cols = turn.input_ids.shape[0] + np.arange(turn.output_ids.shape[0])
        index, loss = batch["mask_index"][row, cols], batch["loss_mask"][row, cols]
        if turn.masks is None:
            assert np.all(index == -1) and np.all(loss == 1)
            continue
        forced = turn.masks.forced
        assert np.all(loss[forced] == 0) and np.all(batch["rollout_logp"][row, cols][forced] == 0)
        assert np.all(loss[~forced] == 1) and np.all(index[~forced] >= 0)
        for j in np.flatnonzero(~forced):  # the row's table holds the call's mask
            np.testing.assert_array_equal(
                table[row, index[j]], turn.masks.table[turn.masks.index[j]]
            )
    if layout == "concat":  # two calls of one grammar share masks: each is stored once
        first, second = view.turns[0].masks.table, view.turns[2].masks.table
        union = {mask.tobytes() for mask in (*first, *second)}
        assert len(union) < len(first) + len(second)
        assert len({t.tobytes() for t in table[0] if t.any()}) == len(union)


def test_without_a_replay_a_constrained_call_is_refused_by_name():
    view = training_view(_constrained("c", [None, GRAMMARS["named"]], seed=4))
    with pytest.raises(ValueError, match=r"trajectory 'c' event 2: .*token mask.*MaskReplay"):
        trajectory_rows(view, "windowed")


def test_malformed_grammar_fields_are_named():
    with pytest.raises(
        ValueError, match=r"where: llm\.decoding\.extra\.grammar must be a non-empty"
    ):
        call_constraint({"grammar": 3}, "where")
    with pytest.raises(ValueError, match="stop_token_ids must be a list of ids"):
        call_constraint({"grammar": "start: x", "stop_token_ids": ["x"]}, "where")


def test_a_grammar_that_refuses_the_tokens_is_named_and_the_rest_loads(tmp_path, caplog):
    good = _constrained("good-1", [GRAMMARS["required"], None], seed=5)
    other = _constrained("good-2", [GRAMMARS["json_object_or_call"]], seed=6)
    # sampled as JSON, recorded as a forced set_lamp call: the first token is refused
    bad = _regrammar(
        _constrained("bad", [None, GRAMMARS["json_schema"]], seed=7), 2, GRAMMARS["named"]
    )
    broken = _regrammar(
        _constrained("broken", [GRAMMARS["json_schema"]], seed=8), 0, "start: %json {"
    )
    store = AtdpStore.open(tmp_path)
    with store.writer("acme") as writer:
        writer.append([good, bad, broken, other])
    config = LoaderConfig(rows=8, seq_len=512, layout="windowed")
    loader = AtdpLoader(store, ["acme"], principal="acme", config=config, mask_replay=REPLAY)
    with caplog.at_level(logging.WARNING, logger="atdp_io.loader"):
        batches = list(loader.epoch(shard=grain.sharding.ShardOptions(0, 1), shuffle=False))
    refs = [ref for batch in batches for ref in batch[trained_on.BATCH_KEY] if ref.any()]
    loaded = {trained_on.decode_ref(ref).trajectory_id for ref in refs}
    assert loaded == {"good-1", "good-2"}
    assert loader.stats.snapshot()["dropped_bad_constraint"] == 2
    first = int(bad.events[2].llm.output_ids[0])
    assert (
        f"trajectory 'bad' event 2: output token 0 (id {first}) is outside the mask of the "
        "recorded grammar" in caplog.text
    )
    assert "trajectory 'broken' event 0: the recorded grammar does not compile" in caplog.text
    # nothing is lost: the refused trajectories stay stored, readable as they were written
    reader = store.reader("acme", principal="acme")
    reader.refresh()
    stored = reader.read("bad").events[2].llm
    np.testing.assert_array_equal(stored.output_ids, bad.events[2].llm.output_ids)
    with pytest.raises(ConstraintReplayError, match="'bad' event 2"):
        REPLAY.view(reader.read_training_views([reader.entry("bad")])[0])


THINK = tuple(TOKENIZER.backend.token_to_id(tag) for tag in ("<think>", "</think>"))
WORDS = (VOCAB + 31) // 32


def budget_walk(prompt, budget: int, seed: int, limit: int = 40):
    """A reply drawn under the worker's own thinking-budget masks (a real `Slot`), leaning
    towards the tags so the budget is reached: (its ids, the worker's mask or None before
    each)."""
    request = GenerationRequest(input_ids=tuple(prompt), max_tokens=limit, think_budget=budget)
    loop = asyncio.new_event_loop()
    stops = frozenset(STOPS)
    slot = Slot(
        GenerationHandle(request, loop), stops, TextTracker(TOKENIZER, (), stops), admitted_at=0
    )
    if budget is not None:  # as the engine admits it
        slot.start_budget(THINK)
    rng, ids, masks = np.random.default_rng(seed), [], []
    while slot.finish is None:
        mask = slot.next_mask(WORDS)
        allowed = np.ones(VOCAB, bool)
        if mask is not None:
            allowed = np.unpackbits(mask.view(np.uint8), bitorder="little")[:VOCAB].astype(bool)
        allowed[list(STOPS)] = allowed.sum() == 1 and allowed[list(STOPS)]  # run to the limit
        tags = [t for t in THINK if allowed[t]]
        token = int(
            rng.choice(tags) if tags and rng.random() < 0.3 else rng.choice(np.flatnonzero(allowed))
        )
        ids.append(token)
        masks.append(mask)
        slot.extend([token], [0.0], 0, [0.0])
    loop.close()
    return ids, masks


@pytest.mark.parametrize(("budget", "inside"), [(0, False), (2, False), (3, True), (None, False)])
def test_the_replay_rebuilds_the_worker_thinking_budget_masks(budget, inside):
    prompt = [5, 6, 7, THINK[0]] if inside else [5, THINK[0], 9, THINK[1], 7]
    ids, worker_masks = budget_walk(prompt, budget, seed=budget or 11)
    extra = {"think_budget": budget, "stop_token_ids": list(STOPS)}
    view = TrainingView(
        "t",
        (
            LLMTurn(
                0,
                np.asarray(prompt),
                np.asarray(ids),
                *[np.zeros(len(ids))] * 3,
                constraint=call_constraint(extra, "t"),
            ),
        ),
        (),
    )
    (turn,) = REPLAY.view(view).turns
    if budget is None:  # unlimited: the worker applies no mask, and the call is free
        assert all(m is None for m in worker_masks) and turn.masks is None
        return
    masks = turn.masks
    for i, worker in enumerate(worker_masks):
        if worker is None:
            assert not masks.forced[i] and masks.index[i] == -1
        elif allowed_count(worker, VOCAB) == 1:
            assert masks.forced[i] and ids[i] == THINK[1]
        else:
            np.testing.assert_array_equal(masks.table[masks.index[i]], worker)
    # the budget was reached (a forced </think>), or <think> was never allowed
    assert masks.forced.any() if budget else (masks.index >= 0).all()
