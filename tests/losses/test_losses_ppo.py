"""ppo_clip_loss: the clipped surrogate, with dual clip."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sao_jax.losses import ppo_clip_loss

# Ratios per token: 1.5 (A > 0, clipped to 1.2), 0.5 (A > 0, unclipped side smaller),
# 0.5 (A < 0, clipped to 0.8), 5.0 (A < 0, unclipped; dual clip caps it at -c * A).
RATIOS = np.array([[1.5, 0.5, 0.5, 5.0]])
OLD_LOGP = np.full((1, 4), -2.0, np.float32)
LOGP = (OLD_LOGP + np.log(RATIOS)).astype(np.float32)
ADVANTAGES = np.array([[1.0, 2.0, -1.0, -1.0]], np.float32)
MASK = np.ones((1, 4), np.float32)


def test_hand_computed_branches():
    loss, metrics = ppo_clip_loss(LOGP, OLD_LOGP, ADVANTAGES, MASK)
    per_token = [-1.0 * 1.2, -2.0 * 0.5, 1.0 * 0.8, 1.0 * 5.0]
    np.testing.assert_allclose(loss, np.mean(per_token), rtol=1e-5)
    np.testing.assert_allclose(metrics["clip_frac"], 2 / 4)
    np.testing.assert_allclose(metrics["ratio_mean"], RATIOS.mean(), rtol=1e-5)
    approx_kl = np.mean(RATIOS - 1 - np.log(RATIOS))
    np.testing.assert_allclose(metrics["approx_kl"], approx_kl, rtol=1e-5)
    assert metrics["dual_clip_frac"] == 0.0


def test_dual_clip_caps_negative_advantage_tokens():
    loss, metrics = ppo_clip_loss(LOGP, OLD_LOGP, ADVANTAGES, MASK, dual_clip=3.0)
    per_token = [-1.0 * 1.2, -2.0 * 0.5, 1.0 * 0.8, 3.0]
    np.testing.assert_allclose(loss, np.mean(per_token), rtol=1e-5)
    np.testing.assert_allclose(metrics["dual_clip_frac"], 1 / 4)


def test_gradient_flows_only_through_unclipped_tokens():
    grad = jax.grad(lambda x: ppo_clip_loss(x, OLD_LOGP, ADVANTAGES, MASK, dual_clip=3.0)[0])(LOGP)
    # d(-A r)/dlogp = -A r; clipped and dual-clipped tokens are flat.
    np.testing.assert_allclose(grad, [[0.0, -2.0 * 0.5 / 4, 0.0, 0.0]], rtol=1e-5, atol=1e-7)


def test_asymmetric_clip_range():
    _, metrics = ppo_clip_loss(LOGP, OLD_LOGP, ADVANTAGES, MASK, eps_high=0.6)
    # Ratio 1.5 is inside (0.8, 1.6) now: only the A < 0, r = 0.5 token stays clipped.
    np.testing.assert_allclose(metrics["clip_frac"], 1 / 4)


def test_overflowing_log_ratio_stays_finite():
    logp = jnp.array([[0.0, 0.0]])
    old_logp = jnp.array([[-500.0, 0.0]])
    advantages = jnp.array([[-1.0, 1.0]])
    loss, grad = jax.value_and_grad(
        lambda x: ppo_clip_loss(x, old_logp, advantages, jnp.ones((1, 2)))[0]
    )(logp)
    assert np.isfinite(loss) and np.all(np.isfinite(grad))


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"dual_clip": 1.0}, "dual_clip"),
        ({"eps_low": -0.2}, "eps_low"),
        ({"eps_high": np.inf}, "eps_high"),
    ],
)
def test_bad_hyperparameters_name_the_problem(kwargs, match):
    with pytest.raises(ValueError, match=match):
        ppo_clip_loss(LOGP, OLD_LOGP, ADVANTAGES, MASK, **kwargs)
