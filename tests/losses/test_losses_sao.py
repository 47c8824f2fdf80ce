"""SAO objectives: the DIS policy loss and the critic's value loss."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from sao_jax.losses import sao_policy_loss, sao_value_loss

# Row 0: ratios 1 (kept), e^0.5 (kept), e^-1.5 < 0.7 (dropped low), e^2 > 6 (dropped high).
# Row 1: one action token with ratio 1, then padding.
LOGP = np.array([[-1.0, -0.5, -2.0, -1.0], [-0.3, 0.0, 0.0, 0.0]], np.float32)
ROLLOUT_LOGP = np.array([[-1.0, -1.0, -0.5, -3.0], [-0.3, 0.0, 0.0, 0.0]], np.float32)
ADVANTAGES = np.array([[2.0, -1.0, 1.0, 0.5], [3.0, 9.0, 9.0, 9.0]], np.float32)
MASK = np.array([[1, 1, 1, 1], [1, 0, 0, 0]], np.float32)


def test_policy_loss_hand_computed():
    loss, metrics = sao_policy_loss(LOGP, ROLLOUT_LOGP, ADVANTAGES, MASK)
    kept_terms = 1.0 * 2.0 * -1.0 + np.exp(0.5) * -1.0 * -0.5 + 1.0 * 3.0 * -0.3
    np.testing.assert_allclose(loss, -kept_terms / 5, rtol=1e-6)
    np.testing.assert_allclose(metrics["clip_frac"], 2 / 5, rtol=1e-6)
    np.testing.assert_allclose(metrics["clip_low_frac"], 1 / 5, rtol=1e-6)
    np.testing.assert_allclose(metrics["clip_high_frac"], 1 / 5, rtol=1e-6)
    ratios = [1.0, np.exp(0.5), np.exp(-1.5), np.exp(2.0), 1.0]
    np.testing.assert_allclose(metrics["ratio_mean"], np.mean(ratios), rtol=1e-6)
    np.testing.assert_allclose(metrics["num_tokens"], 5.0)
    assert loss.dtype == jnp.float32
    assert all(value.dtype == jnp.float32 and value.shape == () for value in metrics.values())


def test_policy_loss_window_is_configurable_and_strict():
    # eps_high=1.0 makes e^0.5 ~ 1.65 still kept; eps_low=0.0 drops everything with r <= 1.
    _, metrics = sao_policy_loss(LOGP, ROLLOUT_LOGP, ADVANTAGES, MASK, eps_low=0.0, eps_high=1.0)
    # Only e^0.5 survives: ratio exactly 1 is not > 1 - 0 (strict inequality).
    np.testing.assert_allclose(metrics["clip_frac"], 4 / 5, rtol=1e-6)


def test_stale_token_with_overflowing_ratio_is_dropped_without_nan():
    logp = jnp.array([[0.0, -1.0]])
    rollout_logp = jnp.array([[-200.0, -1.0]])  # exp(200) overflows float32
    advantages = jnp.array([[1.0, 2.0]])
    mask = jnp.ones((1, 2))
    loss, grad = jax.value_and_grad(
        lambda x: sao_policy_loss(x, rollout_logp, advantages, mask)[0]
    )(logp)
    np.testing.assert_allclose(loss, -(2.0 * -1.0) / 2)
    np.testing.assert_array_equal(grad, [[0.0, -1.0]])


_policy_grad = jax.jit(jax.grad(lambda *args: sao_policy_loss(*args)[0]))

log_ratio_arrays = hnp.arrays(
    np.float32, (3, 6), elements=st.floats(-2.5, 2.5, width=32, allow_subnormal=False)
)


@settings(max_examples=40, deadline=None)
@given(
    log_ratio=log_ratio_arrays,
    advantages=hnp.arrays(np.float32, (3, 6), elements=st.floats(-3, 3, width=32)),
    mask=hnp.arrays(np.bool_, (3, 6)),
)
def test_policy_gradient_is_minus_r_a_over_n_on_kept_tokens_and_zero_elsewhere(
    log_ratio, advantages, mask
):
    rollout_logp = np.full((3, 6), -1.5, np.float32)
    logp = rollout_logp + log_ratio
    grad = np.asarray(_policy_grad(logp, rollout_logp, advantages, mask))
    ratio = np.exp(logp.astype(np.float64) - rollout_logp)
    kept = mask & (ratio > 0.7) & (ratio < 6.0)
    # Tokens within float rounding of a window edge may fall either way; everything else must not.
    decided = (np.abs(ratio - 0.7) > 1e-4) & (np.abs(ratio - 6.0) > 1e-4)
    n = max(mask.sum(), 1)
    expected = np.where(kept, -ratio * advantages / n, 0.0)
    np.testing.assert_allclose(grad[decided], expected[decided], rtol=1e-4, atol=1e-6)
    assert np.all(grad[~kept & decided] == 0.0), "dropped or masked tokens must get exactly 0"


@pytest.mark.parametrize(
    ("kwargs", "match"), [({"eps_low": -0.1}, "eps_low"), ({"eps_high": 0.0}, "eps_high")]
)
def test_policy_loss_rejects_bad_window(kwargs, match):
    with pytest.raises(ValueError, match=match):
        sao_policy_loss(LOGP, ROLLOUT_LOGP, ADVANTAGES, MASK, **kwargs)


def test_policy_loss_rejects_mismatched_shapes_naming_the_argument():
    with pytest.raises(AssertionError, match=r"advantages \(2, 1\)"):
        sao_policy_loss(LOGP, ROLLOUT_LOGP, ADVANTAGES[:, :1], MASK)


def test_value_loss_hand_computed():
    values = np.array([[1.0, 2.0, 7.0], [0.0, 5.0, 5.0]], np.float32)
    returns = np.array([[2.0, 2.0, 0.0], [1.0, 5.0, 5.0]], np.float32)
    mask = np.array([[1, 1, 0], [1, 0, 0]], np.float32)
    loss, metrics = sao_value_loss(values, returns, mask)
    np.testing.assert_allclose(loss, (1.0 + 0.0 + 1.0) / 3, rtol=1e-6)
    np.testing.assert_allclose(metrics["value_mean"], 1.0, rtol=1e-6)
    np.testing.assert_allclose(metrics["return_mean"], 5 / 3, rtol=1e-6)
    # Var[R] over the mask = 2/9; residuals (1, 0, 1) have variance 2/9 as well.
    np.testing.assert_allclose(metrics["explained_variance"], 0.0, atol=1e-6)
    assert metrics["value_clip_frac"] == 0.0


def test_value_loss_clipping_takes_the_larger_error():
    old_values = np.array([[0.0, 0.0]], np.float32)
    values = np.array([[1.0, 0.1]], np.float32)
    returns = np.array([[2.0, 1.0]], np.float32)
    mask = np.ones((1, 2), np.float32)
    loss, metrics = sao_value_loss(values, returns, mask, old_values=old_values, value_clip=0.5)
    # Token 0: unclipped (1-2)^2 = 1, clipped (0.5-2)^2 = 2.25 -> 2.25 (clipped is larger).
    # Token 1: unclipped (0.1-1)^2 = 0.81, clipped value is 0.1 itself -> 0.81.
    np.testing.assert_allclose(loss, (2.25 + 0.81) / 2, rtol=1e-6)
    np.testing.assert_allclose(metrics["value_clip_frac"], 0.5)
    grad = jax.grad(
        lambda v: sao_value_loss(v, returns, mask, old_values=old_values, value_clip=0.5)[0]
    )(values)
    # The clipped branch is flat in V: token 0 gets no gradient; token 1 gets 2 (V - R) / N.
    np.testing.assert_allclose(grad, [[0.0, 2 * (0.1 - 1.0) / 2]], rtol=1e-6)


def test_explained_variance_is_one_for_perfect_values_and_zero_for_constant_returns():
    returns = np.array([[1.0, 3.0, -2.0]], np.float32)
    mask = np.ones((1, 3), np.float32)
    _, perfect = sao_value_loss(returns, returns, mask)
    np.testing.assert_allclose(perfect["explained_variance"], 1.0)
    _, constant = sao_value_loss(returns, np.ones((1, 3), np.float32), mask)
    assert constant["explained_variance"] == 0.0


def test_value_clip_without_old_values_is_an_error():
    with pytest.raises(ValueError, match="old_values"):
        sao_value_loss(np.zeros((1, 2)), np.zeros((1, 2)), np.ones((1, 2)), value_clip=0.2)


def test_critic_output_with_trailing_axis_is_rejected():
    with pytest.raises(AssertionError, match=r"values \(2, 3, 1\)"):
        sao_value_loss(np.zeros((2, 3, 1)), np.zeros((2, 3)), np.ones((2, 3)))
