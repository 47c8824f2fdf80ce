"""Game records of greedy play: how lost games end, the expert's command at each turn (replayed
from the episode alone), and the game-by-game comparison of two policies."""

import dataclasses

import pytest
from rollout_testlib import env_config, rollout_config, sampler, tokenizer

from sao_jax.rollout import evaluate
from sao_jax.rollout.inspection import (
    GameRecord,
    compare_games,
    expert_commands,
    failure_mode,
    game_record,
    summarize,
)


def record(index, won, commands, admissible=None, expert=None, mode=None, task_type="pick"):
    admissible = admissible or [True] * len(commands)
    valid = [bool(c) for c in commands]
    mode = mode or failure_mode(won, commands, valid, admissible, None)
    return GameRecord(
        game_index=index,
        task_type=task_type,
        won=won,
        commands=tuple(commands),
        valid=tuple(valid),
        admissible=tuple(admissible),
        expert=tuple(expert or [None] * len(commands)),
        truncated_by=None if won else "step_limit",
        mode=mode,
    )


def greedy_episodes(num_games, max_steps):
    """(the evaluation's result, its episodes) on the first games of valid_seen."""
    episodes = []
    result = evaluate(
        sampler(),
        tokenizer(),
        split="valid_seen",
        num_games=num_games,
        num_envs=num_games,
        rollout=rollout_config(),
        env=env_config(max_steps=max_steps),
        on_episode=episodes.append,
    )
    return result, episodes


def test_failure_modes_read_the_last_turns():
    go = ["go to desk 1"] * 5
    assert failure_mode(True, go, [True] * 5, [False] * 5, None) == "won"
    assert failure_mode(False, go, [True] * 5, [False] * 5, "step_limit") == "refused_loop"
    alternating = ["go to desk 1", "go to bed 1"] * 3
    assert failure_mode(False, alternating, [True] * 6, [False] * 6, None) == "refused"
    assert failure_mode(False, go, [True] * 5, [True] * 5, None) == "repeat"
    assert failure_mode(False, [""] * 5, [False] * 5, [False] * 5, None) == "malformed"
    assert failure_mode(False, alternating, [True] * 6, [True] * 6, None) == "wander"
    assert failure_mode(False, go, [True] * 5, [True] * 5, "context") == "context"
    # only the last four turns count: an admitted first command leaves the loop a loop ...
    mixed = [True, False, False, False, False]
    assert failure_mode(False, go, [True] * 5, mixed, None) == "refused_loop"
    # ... one among the last four breaks it
    mixed = [False, True, False, False, False]
    assert failure_mode(False, go, [True] * 5, mixed, None) == "wander"
    assert failure_mode(False, [], [], [], "step_limit") == "wander"


def test_the_expert_is_replayed_in_the_states_the_policy_was_in():
    """The expert's commands, recomputed from the recorded episode, are what a live env that
    played the same commands answers; a game the expert plays itself agrees on every turn."""
    result, episodes = greedy_episodes(3, max_steps=4)
    assert len(episodes) == result.episodes == 3
    assert sorted(e.game_index for e in episodes) == [0, 1, 2]
    assert sum(e.won for e in episodes) == round(result.success_rate * 3)
    for episode in episodes:
        expert = expert_commands(episode)
        (live,) = env_config(max_steps=4, split="valid_seen").make_envs(1)
        live.reset(episode.game_index)
        for turn, command in zip(episode.turns, expert, strict=True):
            assert command == live.expert_action()
            live.step(turn.command)
        games = game_record(episode, expert)
        assert games.commands == tuple(t.command for t in episode.turns)
        assert games.mode == failure_mode(
            episode.won, games.commands, games.valid, games.admissible, episode.truncated_by
        )
        assert GameRecord.from_json(games.to_json()) == games
    # the expert's own play, recorded as an episode, agrees with itself everywhere
    (env,) = env_config(max_steps=30, split="valid_seen").make_envs(1)
    env.reset(0)
    commands = []
    while (command := env.expert_action()) is not None:
        commands.append(command)
        if env.step(command)[2]:
            break
    turns = tuple(dataclasses.replace(episodes[0].turns[0], command=c) for c in commands)
    played = dataclasses.replace(
        next(e for e in episodes if e.game_index == 0), turns=turns, max_steps=30
    )
    assert expert_commands(played) == tuple(commands)
    assert summarize([game_record(played, commands)])["expert_agreement"] == 1.0


def test_compare_games_finds_the_flips_and_where_play_parts():
    expert = ["go to desk 1", "take pen 1 from desk 1", "go to shelf 1", "put pen 1 in shelf 1"]
    before = [
        record(0, True, expert, expert=expert),  # kept
        record(1, True, [*expert[:2], "go to bed 1", "go to bed 1"], expert=expert),  # won -> lost
        record(2, False, ["go to sofa 1"] * 4, [False] * 4, expert=expert),  # lost -> won
        record(3, False, ["go to bed 1"] * 4, expert=expert),  # lost both times
    ]
    after = [
        before[0],
        record(
            1,
            False,
            [*expert[:2], "go to bed 1", "go to bed 1"],
            [True, True, False, False],
            expert,
        ),
        record(2, True, expert, expert=expert),
        before[3],
    ]
    before[1] = record(
        1, True, [*expert[:2], "go to shelf 1", "put pen 1 in shelf 1"], expert=expert
    )
    result = compare_games(before, list(reversed(after)))
    assert (result["both_won"], result["both_lost"], result["gained"], result["lost"]) == (
        1,
        1,
        1,
        1,
    )
    gained, lost = sorted(result["flips"], key=lambda f: not f.gained)
    assert (gained.game_index, gained.turn, gained.before, gained.after) == (
        2,
        0,
        "go to sofa 1",
        "go to desk 1",
    )
    assert gained.agrees == "winner" and gained.lost_mode == "refused_loop"
    assert (lost.game_index, lost.turn, lost.before, lost.after) == (
        1,
        2,
        "go to shelf 1",
        "go to bed 1",
    )
    assert lost.agrees == "winner" and lost.lost_mode == "wander"
    assert result["agrees"] == {"gained": {"winner": 1}, "lost": {"winner": 1}}
    assert result["divergence_turn"] == {"gained": [0], "lost": [2]}
    assert result["alike"] == 2  # games 0 and 3, played the same both times
    summary = summarize(after)
    assert summary["success"] == 0.5 and summary["modes"]["wander"] == 1  # game 1
    assert summary["modes"]["repeat"] == 1  # game 3: "go to bed 1", admitted, four times
    assert summary["expert_agreement"] == pytest.approx((4 + 2 + 4 + 0) / 16)


def test_compare_games_refuses_different_games_and_summarize_none():
    a = [record(0, True, ["go to desk 1"])]
    with pytest.raises(ValueError, match="same games"):
        compare_games(a, [record(1, True, ["go to desk 1"])])
    with pytest.raises(ValueError, match="same games"):
        compare_games(a + a, a)
    with pytest.raises(ValueError, match="no games"):
        summarize([])
    with pytest.raises(ValueError, match="2 expert commands for an episode of"):
        _, (episode,) = greedy_episodes(1, max_steps=1)
        game_record(episode, ["look", "look"])
