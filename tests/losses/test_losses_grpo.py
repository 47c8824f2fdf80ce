"""group_advantages: GRPO's group-relative advantage."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sao_jax.losses import group_advantages


def test_hand_computed_groups():
    rewards = jnp.array([1.0, 0.0, 0.0, 0.0, 2.0, 2.0])
    got = group_advantages(rewards, 3)
    # Group 1: mean 1/3, population std sqrt(2)/3. Group 2: mean 4/3, std 2 sqrt(2)/3.
    first = (np.array([1.0, 0.0, 0.0]) - 1 / 3) / (np.sqrt(2) / 3 + 1e-6)
    second = (np.array([0.0, 2.0, 2.0]) - 4 / 3) / (2 * np.sqrt(2) / 3 + 1e-6)
    np.testing.assert_allclose(got, np.concatenate([first, second]), rtol=1e-5)
    centred = group_advantages(rewards, 3, normalize_std=False)
    np.testing.assert_allclose(centred, [2 / 3, -1 / 3, -1 / 3, -4 / 3, 2 / 3, 2 / 3], rtol=1e-6)
    assert got.dtype == jnp.float32 and got.shape == (6,)


def test_equal_rewards_give_zero_not_nan():
    got = group_advantages(jnp.array([1.0, 1.0, 0.0, 0.0]), 2)
    np.testing.assert_array_equal(got, np.zeros(4))


def test_groups_are_independent_so_padding_groups_change_nothing():
    rng = np.random.default_rng(0)
    rewards = rng.normal(size=8).astype(np.float32)
    padded = np.concatenate([rewards, np.full(4, 1e6, np.float32)])
    np.testing.assert_array_equal(group_advantages(padded, 4)[:8], group_advantages(rewards, 4))


def test_jit_grad_and_bf16():
    rewards = jnp.array([0.5, 1.5, -1.0, 3.0])
    fn = jax.jit(group_advantages, static_argnums=1)
    np.testing.assert_allclose(fn(rewards, 2), group_advantages(rewards, 2))
    grad = jax.grad(lambda r: group_advantages(r, 2, normalize_std=False)[0])(rewards)
    np.testing.assert_allclose(grad, [0.5, -0.5, 0.0, 0.0])
    bf16 = group_advantages(rewards.astype(jnp.bfloat16), 2)
    assert bf16.dtype == jnp.float32
    np.testing.assert_allclose(bf16, group_advantages(rewards, 2), rtol=1e-6)


@pytest.mark.parametrize(
    ("rewards", "group_size", "kwargs", "match"),
    [
        (np.zeros(6), 4, {}, "divide the 6 rows"),
        (np.zeros(6), 0, {}, "group_size=0"),
        (np.zeros(6), 2.0, {}, "Python int"),
        (np.zeros((2, 3)), 3, {}, r"rewards must be \[N\]"),
        (np.zeros(6), 3, {"eps": 0.0}, "eps"),
    ],
)
def test_bad_input_names_the_problem(rewards, group_size, kwargs, match):
    with pytest.raises((ValueError, AssertionError), match=match):
        group_advantages(rewards, group_size, **kwargs)
