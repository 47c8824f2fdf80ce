"""Agent loop at non-default decoding: each turn records the log-probs of the distribution it
actually sampled from (`decoding.extra["sampled_logprobs"]`, the serving proxy's format), the
loader reads them as `rollout_logp` with the transform, and the learner's transformed
log-prob at the same weights equals them (DIS ratio 1); at temperature 1 nothing extra is
recorded."""

import numpy as np
import pytest
from rollout_testlib import (
    NUM_ENVS,
    dis_learner,
    env_config,
    open_store,
    read_batches,
    rollout_config,
    sampler,
    tokenizer,
)

from atdp_io import EventKind
from atdp_io.rows import SAMPLING_KEYS
from sao_jax.rollout import AgentLoop

TENANT = "behaviour"
ROWS = 16  # every batch one shape: the learner compiles its log-prob function once


def play(tmp_path, **decoding):
    """(episodes, the one loader batch of them) at these decoding settings."""
    layout = decoding.pop("layout", "windowed")
    config = rollout_config(layout=layout, **decoding)
    loop = AgentLoop(sampler(), tokenizer(), env_config().make_envs(NUM_ENVS), config)
    episodes = [e for g in loop.play(max_episodes=NUM_ENVS) for e in g]
    store = open_store(tmp_path / "atdp")
    with store.writer(TENANT) as writer:
        writer.append([e.to_trajectory(tenant=TENANT) for e in episodes])
    (batch,), _ = read_batches(store, TENANT, layout, rows=ROWS)
    return episodes, batch


def recorded(episode) -> list:
    """Each LLM call's `decoding.extra.get("sampled_logprobs")` in the ATDP record."""
    events = episode.to_trajectory(tenant=TENANT).events
    return [
        e.llm.decoding.extra.get("sampled_logprobs") for e in events if e.kind == EventKind.LLM_CALL
    ]


@pytest.mark.parametrize(
    "decoding",
    [
        dict(temperature=0.7, top_k=5),
        dict(top_p=0.8, layout="concat"),  # later turns extend the slot's cache
        dict(temperature=0.0),  # greedy: a point mass, log-prob 0
    ],
    ids=["temperature-top_k", "top_p-concat", "greedy"],
)
def test_the_dis_ratio_is_one_at_the_rollout_weights(tmp_path, decoding):
    episodes, batch = play(tmp_path, **decoding)
    turns = [t for e in episodes for t in e.turns]
    assert turns
    for episode in episodes:
        for turn, stored in zip(episode.turns, recorded(episode), strict=True):
            assert turn.sampled_logprobs.shape == turn.output_ids.shape
            assert isinstance(stored, list) and all(isinstance(x, float) for x in stored)
            np.testing.assert_array_equal(np.float32(stored), turn.sampled_logprobs)
            assert np.all(turn.sampled_logprobs <= 0)
    assert set(SAMPLING_KEYS) <= set(batch)
    action = batch["loss_mask"] > 0
    assert action.sum() == sum(t.output_ids.shape[0] for t in turns)
    recorded_logp = np.concatenate([t.sampled_logprobs for t in turns])
    np.testing.assert_array_equal(np.sort(batch["rollout_logp"][action]), np.sort(recorded_logp))
    temperature = decoding.get("temperature", 1.0)
    np.testing.assert_allclose(batch["sample_temperature"][action], temperature)
    np.testing.assert_array_equal(batch["sample_top_k"][action], decoding.get("top_k", 0))
    np.testing.assert_allclose(batch["sample_top_p"][action], decoding.get("top_p", 1.0))

    logp = dis_learner().policy_logprobs(batch)
    ratio = np.exp(logp - batch["rollout_logp"])
    np.testing.assert_allclose(ratio[action], 1.0, atol=2e-4)
    if temperature == 0:
        np.testing.assert_array_equal(recorded_logp, 0.0)
    # Not vacuous: the temperature-1 log-probs (what was recorded before) give another ratio.
    plain = {k: v for k, v in batch.items() if k not in SAMPLING_KEYS}
    raw = np.exp(dis_learner().policy_logprobs(plain) - batch["rollout_logp"])
    assert np.abs(raw[action] - 1).max() > 1e-2
    temperature_1 = np.concatenate([t.output_logprobs for t in turns])
    assert np.abs(temperature_1 - recorded_logp).max() > 1e-2


def test_identity_decoding_records_no_sampled_logprobs(tmp_path):
    episodes, batch = play(tmp_path)
    for episode in episodes:
        assert all(t.sampled_logprobs is None for t in episode.turns)
        assert all(stored is None for stored in recorded(episode))
    assert not set(SAMPLING_KEYS) & set(batch)
    # The behaviour log-probs are the temperature-1 ones, and the learner agrees.
    action = batch["loss_mask"] > 0
    logp = dis_learner().policy_logprobs(batch)
    np.testing.assert_allclose(logp[action], batch["rollout_logp"][action], atol=2e-4)


def test_a_temperature_changed_during_play_applies_to_episodes_that_start_after(tmp_path):
    """`AgentLoop.set_temperature` (RL's temperature schedule): episodes already started keep
    theirs; each episode records the temperature it was sampled at, with behaviour log-probs
    only when it is not 1, and one loader batch of both kinds trains at ratio 1."""
    loop = AgentLoop(sampler(), tokenizer(), env_config().make_envs(NUM_ENVS), rollout_config())
    admitted = 0

    def admit(n: int, block: bool) -> bool:
        nonlocal admitted
        if admitted == NUM_ENVS // 2:  # half the slots start at 1, half at 0.7
            loop.set_temperature(0.7)
        admitted += n
        return admitted <= NUM_ENVS

    episodes = [e for g in loop.play(admit=admit) for e in g]
    assert len(episodes) == NUM_ENVS and loop.temperature == 0.7
    by_temperature = {}
    for episode in episodes:
        by_temperature.setdefault(episode.decoding.temperature, []).append(episode)
        stored = recorded(episode)
        if episode.decoding.temperature == 1.0:
            assert all(t.sampled_logprobs is None for t in episode.turns)
            assert all(s is None for s in stored)
        else:
            assert all(t.sampled_logprobs.shape == t.output_ids.shape for t in episode.turns)
            assert all(isinstance(s, list) for s in stored)
    assert sorted(by_temperature) == [0.7, 1.0]
    assert [len(v) for v in by_temperature.values()] == [NUM_ENVS // 2] * 2

    store = open_store(tmp_path / "atdp")
    with store.writer(TENANT) as writer:
        writer.append([e.to_trajectory(tenant=TENANT) for e in episodes])
    (batch,), _ = read_batches(store, TENANT, "windowed", rows=ROWS)
    action = batch["loss_mask"] > 0
    cooled = sum(t.output_ids.shape[0] for e in by_temperature[0.7] for t in e.turns)
    assert np.isclose(batch["sample_temperature"][action], 0.7).sum() == cooled
    assert (batch["sample_temperature"][action] == 1.0).sum() == action.sum() - cooled
    ratio = np.exp(dis_learner().policy_logprobs(batch) - batch["rollout_logp"])
    np.testing.assert_allclose(ratio[action], 1.0, atol=2e-4)


@pytest.mark.parametrize("temperature", [0, -0.5, True, "0.7", float("nan")])
def test_set_temperature_refuses_what_it_cannot_train_on(temperature):
    loop = AgentLoop(sampler(), tokenizer(), env_config().make_envs(NUM_ENVS), rollout_config())
    with pytest.raises(ValueError, match="temperature"):
        loop.set_temperature(temperature)
    assert loop.temperature == 1.0 and not loop.behaviour
