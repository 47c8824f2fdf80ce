"""Greedy evaluation: counts per task type, agreement with the episodes it plays,
determinism whatever the batch size, and clear errors."""

import dataclasses

import pytest
from rollout_testlib import env_config, rollout_config, sampler, tokenizer

from sao_jax.envs.alfworld import TASK_TYPES, make_game
from sao_jax.rollout import AgentLoop, EvalResult, RolloutStats, combine_snapshots, evaluate


def run(num_envs=4, **kwargs):
    kwargs = {"num_games": 6, "rollout": rollout_config(), "env": env_config(max_steps=2), **kwargs}
    return evaluate(sampler(), tokenizer(), split="valid_seen", num_envs=num_envs, **kwargs)


def test_counts_match_the_greedy_episodes_of_the_first_games():
    result = run()
    types = [make_game("valid_seen", i, size="small").task.task_type for i in range(6)]
    assert result.split == "valid_seen" and result.episodes == 6
    assert set(result.by_task_type) == set(TASK_TYPES)
    for task_type, row in result.by_task_type.items():
        assert row["episodes"] == types.count(task_type)
    greedy = dataclasses.replace(rollout_config(), temperature=0.0)
    envs = env_config(max_steps=2, split="valid_seen").make_envs(4)
    stats = RolloutStats()
    for group in AgentLoop(sampler(), tokenizer(), envs, greedy).play(range(6)):
        stats.add_episodes(group)
    expected = stats.snapshot()
    assert result.success_rate == expected["success_rate"]
    assert result.avg_steps == expected["avg_steps"]
    assert result.invalid_reply_rate == expected["invalid_reply_rate"]
    assert result.inadmissible_rate == expected["inadmissible_rate"]
    assert result.avg_reward == pytest.approx(expected["avg_reward"])
    metrics = result.metrics()
    assert metrics["eval/valid_seen/success"] == result.success_rate
    assert f"eval/valid_seen/success/{types[0]}" in metrics


def test_deterministic_and_greedy_whatever_the_sampling_settings():
    first, again = run(), run(rollout=rollout_config(temperature=1.3, top_k=5))
    for field in (
        "success_rate",
        "by_task_type",
        "avg_steps",
        "invalid_reply_rate",
        "inadmissible_rate",
        "repeat_rate",
        "avg_reward",
    ):
        assert getattr(first, field) == getattr(again, field)


def test_evaluation_under_sampling_plays_each_game_n_times_reproducibly():
    """`temperature` / `samples_per_game`: the policy RL samples from, not its argmax; the
    result is over games x samples episodes and does not depend on the batch size."""
    played, greedy_played = [], []
    sampled = run(num_games=3, temperature=1.0, samples_per_game=2, on_episode=played.append)
    assert sampled.episodes == 6
    assert sorted(e.game_index for e in played) == [0, 0, 1, 1, 2, 2]
    assert {e.decoding.temperature for e in played} == {1.0}
    again = run(num_games=3, num_envs=3, temperature=1.0, samples_per_game=2)
    assert (again.success_rate, again.avg_steps, again.invalid_reply_rate) == (
        sampled.success_rate,
        sampled.avg_steps,
        sampled.invalid_reply_rate,
    )
    run(num_games=3, on_episode=greedy_played.append)
    replies = {tuple(e.turns[0].output_ids) for e in played}
    assert len(replies) > 1  # the samples differ from one another ...
    assert replies != {tuple(e.turns[0].output_ids) for e in greedy_played}  # ... and from greedy


@pytest.mark.parametrize(
    ("temperature", "samples", "message"),
    [
        (0.0, 2, "greedy play repeats itself"),
        (-0.5, 1, "temperature must be >= 0"),
        (1.0, 0, "samples_per_game >= 1"),
        (1.0, 2.0, "samples_per_game must be an int"),
        ("hot", 1, "temperature must be a number"),
    ],
)
def test_bad_sampling_settings_name_the_problem(temperature, samples, message):
    with pytest.raises(ValueError, match=message):
        run(temperature=temperature, samples_per_game=samples)


def test_bad_arguments_name_the_problem():
    with pytest.raises(ValueError, match=r"num_games must be in \[1, 140\]"):
        run(num_games=141)
    with pytest.raises(ValueError, match="num_games"):
        run(num_games=0)
    with pytest.raises(ValueError, match="unknown split"):
        evaluate(sampler(), tokenizer(), split="valid_unseeen")


def test_shards_of_the_games_combine_into_the_whole_evaluation():
    """What each process of a multi-host job evaluates (`shard=`) adds up to one evaluation."""
    whole = run(num_games=5)
    parts = [run(num_games=5, shard=(index, 2)) for index in range(2)]
    assert [p.episodes for p in parts] == [3, 2]  # games 0, 2, 4 and 1, 3
    combined = EvalResult.combine(parts)
    assert combined.episodes == whole.episodes == 5
    assert combined.by_task_type == whole.by_task_type
    for field in (
        "success_rate",
        "avg_steps",
        "invalid_reply_rate",
        "inadmissible_rate",
        "repeat_rate",
        "avg_reward",
    ):
        assert getattr(combined, field) == pytest.approx(getattr(whole, field)), field
    assert combined.truncated_context == whole.truncated_context


def test_combine_weights_by_episodes_and_steps():
    def part(episodes, won, steps, invalid, inadmissible=0, repeated=0):
        return EvalResult(
            split="valid_seen",
            episodes=episodes,
            success_rate=won / episodes,
            by_task_type={"pick_and_place_simple": {"episodes": episodes, "won": won}},
            avg_steps=steps / episodes,
            invalid_reply_rate=invalid / steps,
            inadmissible_rate=inadmissible / steps,
            avg_reward=won * 10.0 / episodes,
            truncated_context=1,
            policy_version=3,
            wall_seconds=float(episodes),
            repeat_rate=repeated / steps,
        )

    combined = EvalResult.combine([part(4, 1, 40, 4, 10, 8), part(1, 1, 2, 2, 1, 0)])
    assert combined.success_rate == pytest.approx(2 / 5)
    assert combined.avg_steps == pytest.approx(42 / 5)
    assert combined.invalid_reply_rate == pytest.approx(6 / 42)  # per step, not per episode
    assert combined.inadmissible_rate == pytest.approx(11 / 42)
    assert combined.repeat_rate == pytest.approx(8 / 42)
    assert combined.metrics()["eval/valid_seen/repeat_rate"] == pytest.approx(8 / 42)
    assert combined.by_task_type["pick_and_place_simple"]["success_rate"] == pytest.approx(2 / 5)
    assert combined.avg_reward == pytest.approx(20 / 5)
    assert combined.truncated_context == 2 and combined.wall_seconds == 4.0


def test_combine_and_shard_refuse_what_does_not_belong_together():
    one = run(num_games=2)
    other = dataclasses.replace(one, policy_version=one.policy_version + 1)
    with pytest.raises(ValueError, match="different splits or policy versions"):
        EvalResult.combine([one, other])
    with pytest.raises(ValueError, match="no results"):
        EvalResult.combine([])
    with pytest.raises(ValueError, match="shard must be"):
        run(shard=(2, 2))
    assert run(num_games=1, shard=(1, 2)).episodes == 0  # more processes than games: empty


def test_rollout_stats_of_parts_combine_into_the_stats_of_the_whole():
    greedy = dataclasses.replace(rollout_config(), temperature=0.0)
    envs = env_config(max_steps=2, split="valid_seen").make_envs(4)
    whole, first, second = RolloutStats(), RolloutStats(), RolloutStats()
    for index, group in enumerate(AgentLoop(sampler(), tokenizer(), envs, greedy).play(range(6))):
        whole.add_episodes(group)
        (first if index % 2 else second).add_episodes(group)
    first.add("dropped_stale", 2)
    whole.add("dropped_stale", 2)
    combined = combine_snapshots([first.snapshot(), second.snapshot()])
    expected = whole.snapshot()
    assert combined.keys() == expected.keys()
    assert combined.pop("by_task_type") == expected.pop("by_task_type")
    for key, value in expected.items():
        assert combined[key] == pytest.approx(value), key


def test_inadmissible_commands_are_well_formed_commands_the_room_refuses():
    """A malformed reply counts as invalid, not inadmissible; an admitted command as neither."""
    greedy = dataclasses.replace(rollout_config(), temperature=0.0)
    envs = env_config(max_steps=2, split="valid_seen").make_envs(1)
    episode = next(iter(AgentLoop(sampler(), tokenizer(), envs, greedy).play(range(1))))[0]
    turn = episode.turns[0]
    turns = [
        dataclasses.replace(turn, valid_reply=True, admissible=False),
        dataclasses.replace(turn, valid_reply=False, admissible=False),
        dataclasses.replace(turn, valid_reply=True, admissible=True),
    ]
    episode = dataclasses.replace(episode, turns=turns)
    assert episode.inadmissible_commands == 1 and episode.invalid_replies == 1
    stats = RolloutStats()
    stats.add_episodes([episode, episode])
    snapshot = stats.snapshot()
    assert snapshot["inadmissible_commands"] == 2
    assert snapshot["inadmissible_rate"] == pytest.approx(2 / 6)
    assert snapshot["invalid_reply_rate"] == pytest.approx(2 / 6)
