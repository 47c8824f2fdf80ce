"""LearnerConfig's nested per-algorithm configs: overrides by dotted key, checks on each, and an
old flat key refused with the nested one suggested."""

import dataclasses

import pytest

from sao_jax.config_cli import ConfigError, apply_overrides
from sao_jax.losses import get_policy_loss
from sao_jax.models import MoeAuxConfig
from sao_jax.train import (
    ClipConfig,
    CriticConfig,
    DisConfig,
    GaeConfig,
    GroupConfig,
    LearnerConfig,
    OpdConfig,
)


@dataclasses.dataclass
class Experiment:
    learner: LearnerConfig = dataclasses.field(default_factory=LearnerConfig)


def test_nested_overrides_reach_their_config():
    config = apply_overrides(
        Experiment(),
        [
            "learner.dis.eps_low=0.2",
            "learner.clip.ppo_epochs=3",
            "learner.gae.policy_lam=0.9",
            "learner.critic.warmup_steps=0",
            "learner.group.size=8",
            "learner.opd.mode=signed",
            "learner.opd.clip=2.0",
            "learner.moe.router_z_weight=0",
        ],
    ).learner
    assert config.dis == DisConfig(eps_low=0.2, eps_high=DisConfig().eps_high)
    assert config.clip.ppo_epochs == 3 and config.gae.policy_lam == 0.9
    assert config.critic == CriticConfig(warmup_steps=0)
    assert config.group == GroupConfig(size=8)
    assert config.opd == OpdConfig(mode="signed", clip=2.0)
    assert config.moe == MoeAuxConfig(router_z_weight=0.0)


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ("eps_low", "learner.dis.eps_low"),
        ("clip_eps_high", "learner.clip.eps_high"),
        ("critic_warmup_steps", "learner.critic.warmup_steps"),
        ("critic_steps", "learner.critic.steps"),
        ("group_size", "learner.group.size"),
        ("opd_mode", "learner.opd.mode"),
    ],
)
def test_an_old_flat_key_is_refused_with_the_nested_one_suggested(old, new):
    with pytest.raises(ConfigError, match=f"unknown key 'learner.{old}'") as error:
        apply_overrides(Experiment(), [f"learner.{old}=1"])
    assert f"Did you mean '{new}'" in str(error.value)


@pytest.mark.parametrize(
    ("build", "match"),
    [
        (lambda: DisConfig(eps_low=1.5), "DisConfig: need 0 <= eps_low <= 1"),
        (lambda: ClipConfig(ppo_epochs=0), r"ClipConfig\.ppo_epochs must be >= 1"),
        (lambda: GaeConfig(gamma=1.5), r"GaeConfig\.gamma must be in \[0.0, 1.0\]"),
        (lambda: GaeConfig(policy_lam=-0.1), r"GaeConfig\.policy_lam must be in"),
        (lambda: CriticConfig(value_clip=0.0), r"CriticConfig\.value_clip must be > 0"),
        (lambda: CriticConfig(lam=2.0), r"CriticConfig\.lam must be in"),
        (lambda: GroupConfig(size=0), r"GroupConfig\.size must be >= 1"),
        (lambda: OpdConfig(clip=1.0), r"OpdConfig\.clip must be > 0 and needs mode='signed'"),
        (lambda: OpdConfig(weight=-1.0), r"OpdConfig\.weight / beta must be >= 0"),
    ],
)
def test_bad_values_are_named(build, match):
    with pytest.raises(ValueError, match=match):
        build()


def test_defaults_are_the_losses_defaults():
    # one definition: the config's bounds are the objectives' own defaults
    for name, config in (("sao", DisConfig()), ("ppo", ClipConfig())):
        bound = get_policy_loss(name)
        assert bound.func.__kwdefaults__["eps_low"] == config.eps_low
        assert bound.func.__kwdefaults__["eps_high"] == config.eps_high
