"""`RolloutConfig.repeat_penalty`: an admitted command whose answer the episode has already seen
is flagged on its turn, penalised when asked (reward source "novelty" in the ATDP step), counted
in the rollout stats, and reaches the learner's rows at the turn's last token."""

import pytest
from rollout_testlib import (
    NUM_ENVS,
    env_config,
    model_config,
    open_store,
    read_batches,
    rollout_config,
    sampler,
)
from rollout_testlib import tokenizer as make_tokenizer

from atdp_io import EventKind
from atdp_io.mask_replay import MaskReplay
from sao_jax.rollout import AgentLoop
from sao_jax.rollout.stats import RolloutStats

TENANT = "novelty"
PENALTY = -0.5


def play(repeat_penalty):
    # replies kept to the listed commands: every turn is well formed and admitted, so the
    # random policy wanders the room and comes back to places it has seen
    config = rollout_config(
        reply_choices=True, prompt_style="compact", repeat_penalty=repeat_penalty
    )
    envs = env_config(max_steps=8).make_envs(NUM_ENVS)
    loop = AgentLoop(sampler(), make_tokenizer(), envs, config)
    return [e for g in loop.play(range(NUM_ENVS), max_episodes=NUM_ENVS) for e in g]


def test_repeated_answers_are_flagged_penalised_stored_and_trained_on(tmp_path):
    episodes = play(PENALTY)
    repeated = 0
    for episode in episodes:
        seen = {episode.turns[0].observation}  # the opening text
        for turn in episode.turns:
            assert turn.valid_reply and turn.admissible
            expected = turn.next_observation in seen
            assert turn.repeated_observation == expected, (turn.command, turn.next_observation)
            assert turn.novelty_reward == (PENALTY if expected else 0.0)
            seen.add(turn.next_observation)
            repeated += expected
        assert episode.repeated_observations == sum(t.repeated_observation for t in episode.turns)
        assert episode.total_reward == pytest.approx(
            sum(t.env_reward + t.format_reward + t.novelty_reward for t in episode.turns)
        )
    turns = [t for e in episodes for t in e.turns]
    assert 0 < repeated < len(turns)  # the test sees both kinds of turn

    stats = RolloutStats()
    stats.add_episodes(episodes)
    snapshot = stats.snapshot()
    assert snapshot["repeated_observations"] == repeated
    assert snapshot["repeat_rate"] == pytest.approx(repeated / len(turns))

    # the ATDP step says so, with the penalty as its own reward source
    for episode in episodes:
        steps = [e for e in episode.to_trajectory(tenant=TENANT).events]
        steps = [e for e in steps if e.kind == EventKind.ENV_STEP]
        for turn, event in zip(episode.turns, steps, strict=True):
            assert event.result["repeated_observation"] == turn.repeated_observation
            novelty = [r.value for r in event.rewards if r.source == "novelty"]
            assert novelty == ([PENALTY] if turn.repeated_observation else [])

    # and the learner's windowed rows carry it at the turn's last reply token
    store = open_store(tmp_path / "atdp")
    with store.writer(TENANT) as writer:
        writer.append([e.to_trajectory(tenant=TENANT) for e in episodes])
    replay = MaskReplay.from_tokenizer(make_tokenizer(), model_config().vocab_size)
    (batch,), _ = read_batches(store, TENANT, "windowed", rows=64, mask_replay=replay)
    assert (batch["traj_index"] >= 0).sum() == len(turns)
    for r, turn in enumerate(turns):
        end = turn.input_ids.shape[0] + turn.output_ids.shape[0] - 1
        assert batch["rewards"][r, end] == pytest.approx(turn.reward)


def test_without_the_penalty_the_flags_stay_and_the_reward_is_the_papers():
    shaped, plain = play(PENALTY), play(0.0)
    # the reward never changes what is sampled: the same games, the same turns
    flags = [[t.repeated_observation for t in e.turns] for e in plain]
    assert flags == [[t.repeated_observation for t in e.turns] for e in shaped]
    assert any(any(f) for f in flags)
    for episode in plain:
        assert all(t.novelty_reward == 0.0 for t in episode.turns)
        events = episode.to_trajectory(tenant=TENANT).events
        assert not any(r.source == "novelty" for e in events for r in e.rewards)
    assert sum(e.total_reward for e in shaped) == pytest.approx(
        sum(e.total_reward for e in plain) + PENALTY * sum(sum(f) for f in flags)
    )


def test_a_refused_or_malformed_command_is_never_a_repeat():
    """A refused command answered "Nothing happens." again is the refused-command penalty's
    business, not this one's."""
    config = rollout_config(repeat_penalty=PENALTY)  # free replies: the random policy babbles
    envs = env_config(max_steps=4).make_envs(NUM_ENVS)
    loop = AgentLoop(sampler(), make_tokenizer(), envs, config)
    episodes = [e for g in loop.play(range(NUM_ENVS), max_episodes=NUM_ENVS) for e in g]
    echoed = 0  # refused turns whose answer the episode had seen: not vacuous
    for episode in episodes:
        seen = {episode.turns[0].observation}
        for turn in episode.turns:
            if not (turn.valid_reply and turn.admissible):
                assert not turn.repeated_observation and turn.novelty_reward == 0.0
                echoed += turn.next_observation in seen
            seen.add(turn.next_observation)
    assert echoed
