"""Action-only GAE against an independent numpy reference, and VAPO's adaptive lambda."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from sao_jax.losses import action_only_gae, adaptive_lambda

B, T = 3, 10
_gae = jax.jit(lambda r, v, m, g, lam: action_only_gae(r, v, m, gamma=g, lam=lam))


def reference_gae(rewards, values, gamma, lam):
    """Textbook GAE over one episode (V = 0 after the end), a plain backwards loop in float64."""
    advantages = np.zeros(len(rewards))
    running = 0.0
    for t in reversed(range(len(rewards))):
        next_value = values[t + 1] if t + 1 < len(rewards) else 0.0
        delta = rewards[t] + gamma * next_value - values[t]
        running = delta + gamma * lam * running
        advantages[t] = running
    return advantages


def reference_action_only_gae(rewards, values, mask, gamma, lam):
    """Compact each row to its action tokens (crediting other rewards backwards), GAE, scatter."""
    advantages = np.zeros(rewards.shape)
    returns = np.zeros(rewards.shape)
    for row in range(rewards.shape[0]):
        positions, compact_rewards = [], []
        for t in range(rewards.shape[1]):
            if mask[row, t]:
                positions.append(t)
                compact_rewards.append(float(rewards[row, t]))
            elif positions:
                compact_rewards[-1] += float(rewards[row, t])
        compact_values = values[row, positions].astype(np.float64)
        row_advantages = reference_gae(compact_rewards, compact_values, gamma[row], lam[row])
        advantages[row, positions] = row_advantages
        returns[row, positions] = row_advantages + compact_values
    return advantages, returns


floats = st.floats(-2.0, 2.0, width=32, allow_subnormal=False)
unit = st.floats(0.0, 1.0, width=32)


@settings(max_examples=40, deadline=None)
@given(
    rewards=hnp.arrays(np.float32, (B, T), elements=floats),
    values=hnp.arrays(np.float32, (B, T), elements=floats),
    mask=hnp.arrays(np.bool_, (B, T)),
    gamma=unit,
    lam=hnp.arrays(np.float32, (B,), elements=unit),
)
def test_equals_plain_gae_on_the_compacted_sequence(rewards, values, mask, gamma, lam):
    advantages, returns = _gae(rewards, values, mask, gamma, lam)
    expected_advantages, expected_returns = reference_action_only_gae(
        rewards, values, mask, np.full(B, gamma), lam
    )
    np.testing.assert_allclose(advantages, expected_advantages, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(returns, expected_returns, rtol=1e-4, atol=1e-4)
    assert np.all(advantages[~mask] == 0.0) and np.all(returns[~mask] == 0.0)


@settings(max_examples=30, deadline=None)
@given(
    rewards=hnp.arrays(np.float32, (B, T), elements=floats),
    values=hnp.arrays(np.float32, (B, T), elements=floats),
    mask=hnp.arrays(np.bool_, (B, T)),
    inserted_before=hnp.arrays(np.bool_, (B, T)),
    inserted_values=hnp.arrays(np.float32, (B, T), elements=floats),
    gamma=unit,
    lam=unit,
)
def test_unchanged_by_inserting_observation_tokens(
    rewards, values, mask, inserted_before, inserted_values, gamma, lam
):
    """An observation token (mask 0, reward 0, any value) inserted anywhere changes nothing."""
    advantages, returns = _gae(rewards, values, mask, gamma, lam)
    width = 2 * T  # fixed so the jitted function compiles once
    long = {name: np.zeros((B, width), np.float32) for name in ("rewards", "values", "mask")}
    long["values"][:] = 123.0  # trailing padding with a junk value must not matter either
    original_position = np.zeros((B, T), np.int64)
    for row in range(B):
        column = 0
        for t in range(T):
            if inserted_before[row, t]:
                long["values"][row, column] = inserted_values[row, t]
                column += 1
            original_position[row, t] = column
            long["rewards"][row, column] = rewards[row, t]
            long["values"][row, column] = values[row, t]
            long["mask"][row, column] = mask[row, t]
            column += 1
    long_advantages, long_returns = _gae(long["rewards"], long["values"], long["mask"], gamma, lam)
    rows = np.arange(B)[:, None]
    np.testing.assert_allclose(long_advantages[rows, original_position], advantages, atol=1e-5)
    np.testing.assert_allclose(long_returns[rows, original_position], returns, atol=1e-5)
    assert np.all(np.asarray(long_advantages)[long["mask"] == 0] == 0.0)


def test_hand_computed_with_rewards_on_observation_tokens():
    # Actions at t = 1, 3, 4; the reward at t = 2 belongs to action t = 1, the one at t = 5 to
    # action t = 4, the one at t = 0 precedes every action and is dropped.
    rewards = jnp.array([[5.0, 0.0, 1.0, 0.0, 0.0, 2.0]])
    values = jnp.array([[9.0, 0.5, 9.0, 0.25, 0.75, 9.0]])
    mask = jnp.array([[0, 1, 0, 1, 1, 0]])
    advantages, returns = action_only_gae(rewards, values, mask, gamma=0.5, lam=0.5)
    a4 = 2.0 - 0.75
    a3 = (0.5 * 0.75 - 0.25) + 0.25 * a4
    a1 = (1.0 + 0.5 * 0.25 - 0.5) + 0.25 * a3
    np.testing.assert_allclose(advantages, [[0.0, a1, 0.0, a3, a4, 0.0]], rtol=1e-6)
    np.testing.assert_allclose(returns, [[0.0, a1 + 0.5, 0.0, a3 + 0.25, a4 + 0.75, 0.0]])
    _, undiscounted_returns = action_only_gae(rewards, values, mask)
    np.testing.assert_allclose(undiscounted_returns, [[0.0, 3.0, 0.0, 2.0, 2.0, 0.0]])


def test_per_row_lambda_matches_row_by_row_scalar_lambda():
    rng = np.random.default_rng(0)
    rewards, values = rng.normal(size=(2, B, T)).astype(np.float32)
    mask = rng.random((B, T)) < 0.6
    lam = np.array([0.0, 0.5, 0.95], np.float32)
    per_row, _ = action_only_gae(rewards, values, mask, gamma=0.9, lam=lam)
    for row in range(B):
        alone, _ = action_only_gae(rewards, values, mask, gamma=0.9, lam=float(lam[row]))
        np.testing.assert_allclose(per_row[row], alone[row], rtol=1e-6)


def test_all_zero_mask_and_bf16_inputs():
    zeros_mask = jnp.zeros((B, T))
    garbage_values = jnp.full((B, T), jnp.nan)
    advantages, returns = action_only_gae(jnp.zeros((B, T)), garbage_values, zeros_mask)
    assert np.all(advantages == 0.0) and np.all(returns == 0.0)
    grad = jax.grad(lambda v: action_only_gae(jnp.ones((B, T)), v, zeros_mask)[0].sum())(
        jnp.ones((B, T))
    )
    assert np.all(grad == 0.0)

    rng = np.random.default_rng(1)
    rewards, values = (jnp.asarray(x, jnp.bfloat16) for x in rng.normal(size=(2, B, T)))
    mask = rng.random((B, T)) < 0.7
    bf16_advantages, _ = action_only_gae(rewards, values, mask, lam=0.9)
    f32_advantages, _ = action_only_gae(
        rewards.astype(jnp.float32), values.astype(jnp.float32), mask, lam=0.9
    )
    assert bf16_advantages.dtype == jnp.float32
    np.testing.assert_allclose(bf16_advantages, f32_advantages, rtol=1e-6, atol=1e-6)


def test_differentiable_in_values():
    rng = np.random.default_rng(2)
    rewards, values = rng.normal(size=(2, 1, 4)).astype(np.float32)
    mask = np.array([[1, 0, 1, 1]])
    # gamma = lam = 1: the values telescope, A_i = (rewards from action i on) - V_i, so
    # d(sum A)/dV is -1 on action tokens and 0 on the observation token.
    grad = jax.grad(lambda v: action_only_gae(rewards, v, mask)[0].sum())(values)
    np.testing.assert_allclose(grad, [[-1.0, 0.0, -1.0, -1.0]])


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"gamma": 1.5}, "gamma"),
        ({"lam": -0.1}, "lam"),
        ({"lam": np.ones(B + 1, np.float32)}, r"lam must be a scalar or \[B\]"),
    ],
)
def test_bad_hyperparameters_name_the_problem(kwargs, match):
    with pytest.raises((ValueError, AssertionError), match=match):
        action_only_gae(np.zeros((B, T)), np.zeros((B, T)), np.ones((B, T)), **kwargs)


def test_adaptive_lambda_formula():
    lengths = jnp.array([0, 1, 2, 100])
    expected = [0.0, 1 - 1 / 1.5, 1 - 1 / 3.0, 1 - 1 / 150.0]
    np.testing.assert_allclose(adaptive_lambda(lengths), expected, rtol=1e-6)
    # Clipped at 0 when alpha * L < 1 (VAPO's alpha = 0.05 with a short trajectory).
    np.testing.assert_allclose(adaptive_lambda(jnp.array([10, 40]), alpha=0.05), [0.0, 0.5])
    assert adaptive_lambda(jnp.array([3])).dtype == jnp.float32
    with pytest.raises(ValueError, match="alpha"):
        adaptive_lambda(jnp.array([3]), alpha=0.0)
