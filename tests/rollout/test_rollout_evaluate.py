"""Greedy evaluation: counts per task type, agreement with the episodes it plays,
determinism whatever the batch size, and clear errors."""

import dataclasses

import pytest
from rollout_testlib import env_config, rollout_config, sampler, tokenizer

from sao_jax.envs.alfworld import TASK_TYPES, make_game
from sao_jax.rollout import AgentLoop, RolloutStats, evaluate


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
    assert result.avg_reward == pytest.approx(expected["avg_reward"])
    metrics = result.metrics()
    assert metrics["eval/valid_seen/success"] == result.success_rate
    assert f"eval/valid_seen/success/{types[0]}" in metrics


def test_deterministic_and_greedy_whatever_the_sampling_settings():
    first, again = run(), run(rollout=rollout_config(temperature=1.3, top_k=5))
    for field in ("success_rate", "by_task_type", "avg_steps", "invalid_reply_rate", "avg_reward"):
        assert getattr(first, field) == getattr(again, field)


def test_bad_arguments_name_the_problem():
    with pytest.raises(ValueError, match=r"num_games must be in \[1, 140\]"):
        run(num_games=141)
    with pytest.raises(ValueError, match="num_games"):
        run(num_games=0)
    with pytest.raises(ValueError, match="unknown split"):
        evaluate(sampler(), tokenizer(), split="valid_unseeen")
