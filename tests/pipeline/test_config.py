"""`sao_jax.pipeline.config`: the RL phase's rollout-temperature schedule and its checks."""

import pytest

from sao_jax.pipeline.config import ExperimentConfig, RLSpec, WarmStartSpec
from sao_jax.rollout import RolloutConfig


def test_without_a_final_temperature_the_rollouts_keep_theirs():
    spec = RLSpec(policy_steps=50)
    assert [spec.rollout_temperature(0.9, step) for step in (0, 25, 50, 80)] == [0.9] * 4


def test_the_schedule_is_linear_from_the_rollout_temperature_to_the_final_one():
    spec = RLSpec(policy_steps=100, final_temperature=0.6)
    steps = (0, 25, 50, 100)
    assert [spec.rollout_temperature(1.0, s) for s in steps] == pytest.approx([1, 0.9, 0.8, 0.6])
    # a resumed run extended past its steps, or a step before the phase, stays at the ends
    assert spec.rollout_temperature(1.0, 140) == pytest.approx(0.6)
    assert spec.rollout_temperature(1.0, -3) == pytest.approx(1.0)
    warming = RLSpec(policy_steps=10, final_temperature=1.2)  # it may rise as well
    assert warming.rollout_temperature(0.8, 5) == pytest.approx(1.0)


@pytest.mark.parametrize("final", [0, -1.0, True, "0.5", float("nan")])
def test_a_final_temperature_that_cannot_be_sampled_is_refused(final):
    with pytest.raises(ValueError, match=r"rl\.final_temperature must be a number > 0"):
        RLSpec(final_temperature=final)


def test_a_schedule_needs_sampled_rollouts():
    with pytest.raises(ValueError, match=r"rollout\.temperature is 0"):
        ExperimentConfig(rollout=RolloutConfig(temperature=0.0), rl=RLSpec(final_temperature=0.5))
    ExperimentConfig(rollout=RolloutConfig(temperature=0.5), rl=RLSpec(final_temperature=0.5))


def test_the_cloners_pack_factor_is_a_setting_with_a_floor():
    from experiments.alfworld_sao import PRESETS
    from sao_jax.config_cli import apply_overrides

    assert PRESETS["tiny"].warm_start.pack_factor == 2
    config = apply_overrides(PRESETS["tiny"], ["warm_start.pack_factor=1"])
    assert config.warm_start.pack_factor == 1
    for bad in (0, -2, True):
        with pytest.raises(ValueError, match=r"warm_start\.pack_factor must be an int >= 1"):
            WarmStartSpec(pack_factor=bad)
