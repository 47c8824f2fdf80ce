"""group_advantages: GRPO's group-relative advantage, groups named by id."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sao_jax.losses import group_advantages


def contiguous(n: int, size: int) -> np.ndarray:
    return np.arange(n) // size


def test_hand_computed_groups():
    rewards = jnp.array([1.0, 0.0, 0.0, 0.0, 2.0, 2.0])
    got, size = group_advantages(rewards, contiguous(6, 3))
    # Group 1: mean 1/3, population std sqrt(2)/3. Group 2: mean 4/3, std 2 sqrt(2)/3.
    first = (np.array([1.0, 0.0, 0.0]) - 1 / 3) / (np.sqrt(2) / 3 + 1e-6)
    second = (np.array([0.0, 2.0, 2.0]) - 4 / 3) / (2 * np.sqrt(2) / 3 + 1e-6)
    np.testing.assert_allclose(got, np.concatenate([first, second]), rtol=1e-5)
    np.testing.assert_array_equal(size, [3] * 6)
    centred, _ = group_advantages(rewards, contiguous(6, 3), normalize_std=False)
    np.testing.assert_allclose(centred, [2 / 3, -1 / 3, -1 / 3, -4 / 3, 2 / 3, 2 / 3], rtol=1e-6)
    assert got.dtype == jnp.float32 and got.shape == (6,)


def test_groups_by_id_in_any_order_and_of_any_size():
    rewards = np.array([1.0, 5.0, 0.0, 3.0, 9.0], np.float32)
    ids = np.array([7, 2, 7, 2, 40])  # {0, 2}, {1, 3}, a singleton {4}
    got, size = group_advantages(rewards, ids, normalize_std=False)
    np.testing.assert_allclose(got, [0.5, 1.0, -0.5, -1.0, 0.0])
    np.testing.assert_array_equal(size, [2, 2, 2, 2, 1])
    # the same as contiguous groups after sorting by group
    order = np.argsort(ids[:4], kind="stable")
    sorted_adv, _ = group_advantages(rewards[:4][order], contiguous(4, 2))
    np.testing.assert_allclose(group_advantages(rewards[:4], ids[:4])[0][order], sorted_adv)


def test_non_members_are_scored_but_do_not_count():
    # entry 1 repeats entry 0 (a second row of one rollout), entry 3 is padding
    rewards = np.array([4.0, 4.0, 0.0, 1e6], np.float32)
    ids = np.array([1, 1, 1, 1])
    member = np.array([True, False, True, False])
    got, size = group_advantages(rewards, ids, member=member, normalize_std=False)
    np.testing.assert_allclose(got[:3], [2.0, 2.0, -2.0])
    np.testing.assert_array_equal(size, [2, 2, 2, 2])


def test_equal_rewards_and_singletons_give_zero_not_nan():
    got, _ = group_advantages(jnp.array([1.0, 1.0, 0.0, 0.0]), contiguous(4, 2))
    np.testing.assert_array_equal(got, np.zeros(4))
    alone, size = group_advantages(jnp.array([3.0, -2.0]), jnp.array([0, 1]))
    np.testing.assert_array_equal(alone, [0.0, 0.0])
    np.testing.assert_array_equal(size, [1, 1])


def test_groups_are_independent_so_padding_groups_change_nothing():
    rng = np.random.default_rng(0)
    rewards = rng.normal(size=8).astype(np.float32)
    padded = np.concatenate([rewards, np.full(4, 1e6, np.float32)])
    np.testing.assert_allclose(
        group_advantages(padded, contiguous(12, 4))[0][:8],
        group_advantages(rewards, contiguous(8, 4))[0],
        rtol=1e-6,
    )


def test_jit_grad_and_bf16():
    rewards = jnp.array([0.5, 1.5, -1.0, 3.0])
    ids = jnp.array([0, 0, 1, 1])
    fn = jax.jit(group_advantages)
    np.testing.assert_allclose(fn(rewards, ids)[0], group_advantages(rewards, ids)[0])
    grad = jax.grad(lambda r: group_advantages(r, ids, normalize_std=False)[0][0])(rewards)
    np.testing.assert_allclose(grad, [0.5, -0.5, 0.0, 0.0])
    bf16, _ = group_advantages(rewards.astype(jnp.bfloat16), ids)
    assert bf16.dtype == jnp.float32
    np.testing.assert_allclose(bf16, group_advantages(rewards, ids)[0], rtol=1e-6)


@pytest.mark.parametrize(
    ("rewards", "ids", "kwargs", "match"),
    [
        (np.zeros((2, 3)), np.zeros((2, 3)), {}, r"returns must be \[N\]"),
        (np.zeros(6), np.zeros(5), {}, "group_id must be"),
        (np.zeros(6), np.zeros(6), {"member": np.ones(4, bool)}, "member must be"),
        (np.zeros(6), np.zeros(6), {"eps": 0.0}, "eps"),
    ],
)
def test_bad_input_names_the_problem(rewards, ids, kwargs, match):
    with pytest.raises((ValueError, AssertionError), match=match):
        group_advantages(rewards, ids, **kwargs)
