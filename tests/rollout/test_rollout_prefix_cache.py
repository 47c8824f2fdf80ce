"""Prefill savings of the rollout path: prefix caching across a slot's loads
(`RolloutConfig.prefix_cache`, `Sampler.prefill(cached=...)`), split prefill dispatches
(`plan_prefill`) and the attention window. Each must leave sampled tokens and recorded
log-probs what the uncached, single-dispatch, whole-cache path gives, and encode less."""

from __future__ import annotations

import dataclasses
import functools
import time

import numpy as np
import pytest
from rollout_testlib import (
    NUM_ENVS,
    env_config,
    forward_logprobs,
    model,
    other_weights,
    rollout_config,
    tokenizer,
)

from sao_jax.rollout import AgentLoop, Sampler, SamplingParams
from sao_jax.rollout.sampler import bucket, plan_prefill

# Row-independent differences of XLA's CPU kernels between batch shapes are ~1e-6 (the same
# between slot refill and lock-step); a reused prefix from other weights is off by far more.
LOGP_ATOL = 1e-5


@functools.cache
def tight_sampler() -> Sampler:
    """The test policy with small prompt buckets, so splits and windows change shapes."""
    return Sampler(model(), pad_id=tokenizer().pad_id, min_prompt_bucket=16)


class EncodedPositions:
    """Counts the prompt tokens and padded positions the sampler's prefill dispatches encode."""

    def __init__(self, sampler: Sampler, monkeypatch):
        self.tokens = self.padded = self.dispatches = 0
        dispatch = sampler._dispatch_prefill

        def counting(state, prompts, starts, slots, *rest):
            self.tokens += sum(len(p) for p in prompts)
            longest = max(len(p) for p in prompts)
            self.padded += bucket(len(prompts), 1) * bucket(longest, sampler.min_prompt_bucket)
            self.dispatches += 1
            return dispatch(state, prompts, starts, slots, *rest)

        monkeypatch.setattr(sampler, "_dispatch_prefill", counting)


def play(config, *, new: bool, games, before_dispatch=None, max_steps: int = 5):
    """Episodes of `games` with every saving on (`new`) or off, in game order."""
    sampler = tight_sampler()
    sampler.split_prefill = sampler.attention_window = new
    try:
        envs = env_config(max_steps=max_steps).make_envs(NUM_ENVS)
        config = dataclasses.replace(config, prefix_cache=new)
        loop = AgentLoop(sampler, tokenizer(), envs, config)
        episodes = [e for g in loop.play(games, before_dispatch=before_dispatch) for e in g]
    finally:
        sampler.split_prefill = sampler.attention_window = True
        sampler.update_weights(model(), 0)
    return sorted(episodes, key=lambda e: e.game_index)


def assert_same_episodes(old, new):
    assert [e.game_index for e in old] == [e.game_index for e in new]
    for a, b in zip(old, new, strict=True):
        assert a.steps == b.steps
        for ta, tb in zip(a.turns, b.turns, strict=True):
            np.testing.assert_array_equal(ta.input_ids, tb.input_ids)
            np.testing.assert_array_equal(ta.output_ids, tb.output_ids)
            np.testing.assert_allclose(ta.output_logprobs, tb.output_logprobs, atol=LOGP_ATOL)


@pytest.mark.parametrize("layout", ["windowed", "concat"])
def test_cached_prefill_plays_the_uncached_episodes_and_encodes_less(layout, monkeypatch):
    config = rollout_config(layout=layout, history_length=1, prompt_style="compact")
    games = [3, 8, 14, 21, 30, 2]
    counts = {}
    episodes = {}
    for new in (False, True):
        counts[new] = EncodedPositions(tight_sampler(), monkeypatch)
        episodes[new] = play(config, new=new, games=games)
        monkeypatch.undo()
    assert_same_episodes(episodes[False], episodes[True])
    old, new = counts[False], counts[True]
    assert new.padded < old.padded
    if layout == "windowed":  # every turn after a slot's first skips at least the chat marker
        turns = sum(e.steps for e in episodes[True])
        assert old.tokens == sum(t.input_ids.shape[0] for e in episodes[True] for t in e.turns)
        assert new.tokens <= old.tokens - (turns - NUM_ENVS)
    else:  # concat already extends: only a new episode's first prompt can reuse anything
        assert new.tokens < old.tokens
    # and the recorded log-probs are the policy's: a full forward pass of some turns
    for episode in episodes[True][:2]:
        turn = episode.turns[-1]
        row = np.concatenate([turn.input_ids, turn.output_ids])[None]
        logp = forward_logprobs(row, np.ones_like(row))[0, turn.input_ids.shape[0] :]
        np.testing.assert_allclose(turn.output_logprobs, logp, atol=2e-4)


def test_a_prefix_from_replaced_weights_is_encoded_again():
    """Weights swapped mid-play under the same version number: no slot may reuse a prompt
    prefix the old weights encoded (the sampler's weights generation changed)."""
    config = rollout_config(history_length=1, prompt_style="compact")
    new_weights = other_weights()
    swapped_at = {}

    def swap_at(dispatch: int):
        calls = []

        def before_dispatch():
            calls.append(1)
            if len(calls) == dispatch:
                swapped_at[dispatch] = time.time()
                tight_sampler().update_weights(new_weights, 0)

        return before_dispatch

    games = [4, 9, 16, 25]
    old = play(config, new=False, games=games, before_dispatch=swap_at(5))
    new = play(config, new=True, games=games, before_dispatch=swap_at(5))
    assert_same_episodes(old, new)
    late = [t for e in new for t in e.turns if t.started_at > swapped_at[5]]
    assert len(late) >= NUM_ENVS
    for turn in late[:3]:  # prompt and reply entirely under the new weights
        row = np.concatenate([turn.input_ids, turn.output_ids])[None]
        logp = forward_logprobs(row, np.ones_like(row), new_weights)
        np.testing.assert_allclose(
            turn.output_logprobs, logp[0, turn.input_ids.shape[0] :], atol=2e-4
        )


def decode_all(sampler, state, steps: int = 8):
    state, tokens, logp, emitted = sampler.decode(state, steps)
    return state, tokens, logp, emitted


def test_prefill_with_a_cached_prefix_equals_a_fresh_prefill():
    sampler = tight_sampler()
    shared = [5, 9, 2, 7, 1, 4, 4, 8, 3, 12, 40, 2, 17, 18]
    first_tail, second_tail = [20, 21, 22], [30, 31, 32, 33, 34]
    turn = SamplingParams(temperature=0.0, max_new_tokens=6)
    state = sampler.init_state(num_slots=4, cache_len=64)
    state, *_ = sampler.prefill(state, [shared + first_tail, [6, 6]], [1, 2], turn)
    state, *_ = decode_all(sampler, state)
    # slot 1 holds shared + first_tail (+ its reply): only second_tail is encoded
    state, first, logp, _ = sampler.prefill(
        state, [shared + second_tail, [6, 6, 5]], [1, 2], turn, cached=[len(shared), 2]
    )
    state, tokens, logps, emitted = decode_all(sampler, state)
    fresh = sampler.generate([shared + second_tail, [6, 6, 5]], turn)
    for i, slot in enumerate((1, 2)):
        got = [first[i], *tokens[slot][emitted[slot]]]
        got_logp = [logp[i], *logps[slot][emitted[slot]]]
        n = fresh.lengths[i]
        np.testing.assert_array_equal(got, fresh.tokens[i, :n])
        np.testing.assert_allclose(got_logp, fresh.logprobs[i, :n], atol=LOGP_ATOL)


@pytest.mark.parametrize("split, window", [(True, True), (True, False), (False, True)])
def test_split_and_windowed_loads_equal_one_whole_cache_dispatch(split, window):
    sampler = tight_sampler()
    prompts = [[5] * 40, [7, 1, 4], [33, 2] * 9, [10, 11], [12] * 3, [13, 14, 15, 16]]
    turn = SamplingParams(temperature=1.0, max_new_tokens=5, seed=11)
    results = {}
    try:
        for key in ((False, False), (split, window)):
            sampler.split_prefill, sampler.attention_window = key
            state = sampler.init_state(num_slots=8, cache_len=128)
            state, first, logp, _ = sampler.prefill(state, prompts, [7, 0, 3, 5, 1, 2], turn)
            _, tokens, logps, emitted = decode_all(sampler, state)
            results[key] = (first, logp, tokens, logps, emitted)
    finally:
        sampler.split_prefill = sampler.attention_window = True
    base, other = results[(False, False)], results[(split, window)]
    np.testing.assert_array_equal(base[0], other[0])
    np.testing.assert_array_equal(base[2], other[2])
    np.testing.assert_array_equal(base[4], other[4])
    np.testing.assert_allclose(base[1], other[1], atol=LOGP_ATOL)
    np.testing.assert_allclose(base[3], other[3], atol=LOGP_ATOL)


def test_plan_prefill_covers_every_row_once_and_pads_less():
    lengths = [100, 12, 9, 120, 14, 10]
    groups = plan_prefill(lengths, 16, 512, split_cost=16)
    assert sorted(i for g in groups for i in g) == list(range(len(lengths)))
    # 2 x 128 + 4 x 16 positions and two dispatches, not 8 x 128 in one
    assert groups == [[3, 0], [4, 1, 5, 2]]

    def padded(gs):
        return sum(bucket(len(g), 1) * bucket(max(lengths[i] for i in g), 16) for g in gs)

    assert padded(groups) < padded([list(range(len(lengths)))])
    # splitting never pays for rows of one bucket, nor for a single row
    assert len(plan_prefill([30, 20, 17, 31], 16, 512)) == 1
    assert plan_prefill([7], 16, 512) == [[0]]
    # a dispatch dearer than any padding keeps one dispatch
    assert len(plan_prefill(lengths, 16, 512, split_cost=10_000)) == 1
    with pytest.raises(ValueError, match="at least one row"):
        plan_prefill([], 16, 512)


def test_bad_cached_lengths_raise_clear_errors():
    sampler = tight_sampler()
    state = sampler.init_state(num_slots=2, cache_len=32)
    turn = SamplingParams(max_new_tokens=2)
    with pytest.raises(ValueError, match=r"cached\[0\]=3 must be in \[0, 3\)"):
        sampler.prefill(state, [[1, 2, 3]], [0], turn, cached=[3])
    with pytest.raises(ValueError, match=r"cached\[1\]=-1"):
        sampler.prefill(state, [[1, 2, 3], [4, 5]], [0, 1], turn, cached=[0, -1])
    with pytest.raises(ValueError, match="got 1 cached lengths for 2 prompts"):
        sampler.prefill(state, [[1, 2, 3], [4, 5]], [0, 1], turn, cached=[1])
