"""`interval_rates`: the rollout rates over the episodes between two snapshots of the stats
(the RL phase's `rollout/recent/*`), against the stats of those episodes alone."""

import dataclasses

import pytest
from rollout_testlib import env_config, rollout_config, sampler, tokenizer

from sao_jax.rollout import AgentLoop, RolloutStats
from sao_jax.rollout.stats import COUNTER_RATES, interval_rates


def test_recent_rates_are_those_of_the_episodes_played_in_between():
    config = dataclasses.replace(rollout_config(), temperature=1.0)
    envs = env_config(max_steps=4, split="valid_seen").make_envs(4)
    groups = list(AgentLoop(sampler(), tokenizer(), envs, config).play(range(8)))
    running, later_only = RolloutStats(), RolloutStats()
    half = len(groups) // 2
    for group in groups[:half]:
        running.add_episodes(group)
    first = running.snapshot()
    for group in groups[half:]:
        running.add_episodes(group)
        later_only.add_episodes(group)
    second, alone = running.snapshot(), later_only.snapshot()

    recent = interval_rates(first, second)
    assert recent.keys() == COUNTER_RATES.keys()
    for name, value in recent.items():
        assert value == pytest.approx(alone[name]), name
    # since the counters started: the snapshot's own (cumulative) rates
    assert interval_rates(None, second) == pytest.approx({k: second[k] for k in COUNTER_RATES})
    assert first["episodes"] > 0 and second["episodes"] > first["episodes"]


def test_nothing_in_between_leaves_the_rates_out_and_counters_never_go_back():
    stats = RolloutStats()
    assert interval_rates(None, stats.snapshot()) == {}  # no episode, no step: no rate
    stats.add("env_steps", 10)
    stats.add("invalid_replies", 4)
    steps_only = interval_rates(None, stats.snapshot())
    assert steps_only == pytest.approx(
        {"invalid_reply_rate": 0.4, "inadmissible_rate": 0.0, "repeat_rate": 0.0}
    )  # steps counted but no episode finished: no success rate, not a success rate of 0
    with pytest.raises(ValueError, match="env_steps went down"):
        interval_rates({"env_steps": 11}, stats.snapshot())
