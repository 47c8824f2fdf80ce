"""get_policy_loss: one call signature for every policy objective, picked by config name."""

import jax
import numpy as np
import pytest

from sao_jax.losses import (
    POLICY_LOSS_NAMES,
    get_policy_loss,
    ppo_clip_loss,
    sao_policy_loss,
)

rng = np.random.default_rng(0)
LOGP, BEHAVIOUR_LOGP = rng.normal(-1.0, 0.4, size=(2, 2, 5)).astype(np.float32)
ADVANTAGES = rng.normal(size=(2, 5)).astype(np.float32)
MASK = (rng.random((2, 5)) < 0.7).astype(np.float32)


@pytest.mark.parametrize(
    ("name", "objective"),
    [
        ("sao", sao_policy_loss),
        ("grpo_dis", sao_policy_loss),
        ("grpo", ppo_clip_loss),
        ("ppo", ppo_clip_loss),
    ],
)
def test_each_name_is_its_objective_behind_the_uniform_signature(name, objective):
    assert name in POLICY_LOSS_NAMES
    loss_fn = get_policy_loss(name)
    loss, metrics = jax.jit(loss_fn)(LOGP, BEHAVIOUR_LOGP, ADVANTAGES, MASK)
    expected_loss, expected_metrics = objective(LOGP, BEHAVIOUR_LOGP, ADVANTAGES, MASK)
    np.testing.assert_allclose(loss, expected_loss, rtol=1e-6)
    assert metrics.keys() == expected_metrics.keys()
    grad = jax.grad(lambda x: loss_fn(x, BEHAVIOUR_LOGP, ADVANTAGES, MASK)[0])(LOGP)
    assert grad.shape == LOGP.shape and np.all(np.isfinite(grad))


def test_hyperparameters_are_bound_at_lookup():
    bound = get_policy_loss("ppo", eps_low=0.05, eps_high=0.05, dual_clip=2.0)
    expected = ppo_clip_loss(
        LOGP, BEHAVIOUR_LOGP, ADVANTAGES, MASK, eps_low=0.05, eps_high=0.05, dual_clip=2.0
    )
    np.testing.assert_allclose(bound(LOGP, BEHAVIOUR_LOGP, ADVANTAGES, MASK)[0], expected[0])
    default = get_policy_loss("ppo")(LOGP, BEHAVIOUR_LOGP, ADVANTAGES, MASK)[0]
    assert not np.allclose(default, expected[0]), "the bound hyperparameters had no effect"


def test_unknown_name_lists_the_known_ones():
    with pytest.raises(ValueError, match="'sao'"):
        get_policy_loss("vapo")


def test_unknown_hyperparameter_lists_the_accepted_ones():
    with pytest.raises(ValueError, match=r"does not take \['clip'\].*eps_low"):
        get_policy_loss("sao", clip=0.2)
