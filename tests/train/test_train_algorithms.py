"""The algorithm record decides which of the config's ratio bounds its objective gets."""

import pytest

from sao_jax.train import ClipConfig, DisConfig, LearnerConfig
from sao_jax.train.algorithms import ALGORITHMS, Algorithm, get_algorithm, register_algorithm
from sao_jax.train.learner_steps import policy_loss_fn

CONFIG = {"dis": DisConfig(0.31, 4.5), "clip": ClipConfig(0.11, 0.13)}


@pytest.mark.parametrize(
    ("algorithm", "bounds"),
    [
        ("sao", (0.31, 4.5)),
        ("grpo_dis", (0.31, 4.5)),
        ("sao_seed", (0.31, 4.5)),
        ("grpo", (0.11, 0.13)),
        ("ppo", (0.11, 0.13)),
        ("grpo_seed", (0.11, 0.13)),
    ],
)
def test_builtin_algorithms_bind_their_bounds(algorithm, bounds):
    loss = policy_loss_fn(LearnerConfig(algorithm=algorithm, **CONFIG))
    assert (loss.keywords["eps_low"], loss.keywords["eps_high"]) == bounds


def test_a_new_algorithm_names_its_bounds_not_its_loss():
    # the DIS objective with the clip range: the record decides, not the loss's name
    algorithm = Algorithm("sao_tight", "sao", "clip", "gae", "rollout", True, "SAO (tight)")
    register_algorithm(algorithm)
    try:
        loss = policy_loss_fn(LearnerConfig(algorithm="sao_tight", **CONFIG))
        assert loss.func.__name__ == "sao_policy_loss"
        assert (loss.keywords["eps_low"], loss.keywords["eps_high"]) == (0.11, 0.13)
        assert get_algorithm("sao_tight") is algorithm
    finally:
        del ALGORITHMS["sao_tight"]


def test_bad_ratio_bounds_are_named():
    with pytest.raises(ValueError, match="ratio_bounds must be 'dis' or 'clip'"):
        Algorithm("x", "sao", "trust_region", "gae", "rollout", True, "X")
