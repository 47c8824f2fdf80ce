"""The advantage estimators on real loader batches (both layouts), and the batch glue of
`sao_jax.train.advantages`: GRPO advantages on a batch's tokens, prompt group ids."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from train_factories import episode, first_batch, write_store

from sao_jax.losses import adaptive_lambda, group_advantages, linked_gae, trajectory_action_counts
from sao_jax.train.advantages import grouped_advantages, prompt_group_ids


def _values_by_action_ordinal(batch):
    """Values that depend only on which action token of its trajectory a token is."""
    values = np.zeros(batch["tokens"].shape, np.float32)
    for k in set(batch["traj_index"][batch["traj_index"] >= 0].tolist()):
        rows = sorted(
            np.flatnonzero(batch["traj_index"] == k), key=lambda r: batch["turn_index"][r]
        )
        ordinal = 0
        for r in rows:
            for t in np.flatnonzero(batch["loss_mask"][r]):
                values[r, t] = np.sin(ordinal + k)
                ordinal += 1
    return values


def _action_sequences(batch, x):
    """Per trajectory, x on its action tokens in turn order."""
    out = {}
    for k in set(batch["traj_index"][batch["traj_index"] >= 0].tolist()):
        rows = sorted(
            np.flatnonzero(batch["traj_index"] == k), key=lambda r: batch["turn_index"][r]
        )
        out[k] = np.concatenate([np.asarray(x)[r][batch["loss_mask"][r] > 0] for r in rows])
    return out


def test_windowed_rows_from_the_loader_get_the_concat_layouts_advantages(tmp_path):
    """One store, read in both layouts: the same episodes' action tokens get the same GAE."""
    store = write_store(
        tmp_path, [episode(f"e{i}", seed=i, turns=3, reward=i + 1.0) for i in range(3)]
    )
    concat = first_batch(store, rows=3, seq_len=64, layout="concat")
    windowed = first_batch(store, rows=9, seq_len=64, layout="windowed")
    assert (windowed["turn_index"] >= 0).sum() == 9 and (concat["turn_index"] == 0).all()
    results = {}
    for name, batch in (("concat", concat), ("windowed", windowed)):
        mask = batch["loss_mask"]
        lam = adaptive_lambda(trajectory_action_counts(mask, batch["traj_index"]), 1.5)
        adv, ret = linked_gae(
            batch["rewards"], _values_by_action_ordinal(batch), mask,
            batch["traj_index"], batch["turn_index"], lam=lam,
        )  # fmt: skip
        results[name] = (_action_sequences(batch, adv), _action_sequences(batch, ret), lam)
    for k in range(3):
        np.testing.assert_allclose(results["windowed"][0][k], results["concat"][0][k], rtol=1e-5)
        np.testing.assert_allclose(results["windowed"][1][k], results["concat"][1][k], rtol=1e-5)
    # the windowed rows of a trajectory share the concat row's adaptive lambda (L = 9 tokens)
    np.testing.assert_allclose(results["windowed"][2][:9], adaptive_lambda(jnp.full(9, 9.0)))
    # returns are Monte-Carlo with lambda = 1 and gamma = 1: the episode reward on every token
    returns, _ = linked_gae(
        windowed["rewards"], _values_by_action_ordinal(windowed), windowed["loss_mask"],
        windowed["traj_index"], windowed["turn_index"], lam=1.0,
    )  # fmt: skip
    returns = np.asarray(returns) + _values_by_action_ordinal(windowed)
    for k, seq in _action_sequences(windowed, returns).items():
        np.testing.assert_allclose(seq, k + 1.0, rtol=1e-5)


def test_grouped_advantages_equal_group_advantages_for_complete_groups():
    rng = np.random.default_rng(0)
    group_size, groups = 4, 3
    returns = rng.normal(size=groups * group_size).astype(np.float32)
    rows = groups * group_size + 2  # two padding rows
    rewards = np.zeros((rows, 5), np.float32)
    rewards[: groups * group_size, 2] = returns
    mask = np.zeros((rows, 5), np.float32)
    mask[: groups * group_size, 1:3] = 1
    traj = np.concatenate([np.arange(groups * group_size), [-1, -1]]).astype(np.int32)
    group = np.concatenate([np.repeat(np.array([7, 123456, 99]), group_size), [-1, -1]])
    perm = rng.permutation(rows)  # groups need not be contiguous
    adv, size = grouped_advantages(
        rewards[perm], mask[perm], traj[perm], group[perm].astype(np.int32)
    )
    want, _ = group_advantages(returns, np.arange(groups * group_size) // group_size)
    got = np.asarray(adv)[np.argsort(perm)]
    np.testing.assert_allclose(got[: groups * group_size, 1], want, rtol=1e-5, atol=1e-6)
    assert np.abs(want).max() > 0.5  # a real comparison, not zeros against zeros
    assert np.all(got[:, 0] == 0) and np.all(got[-2:] == 0)
    np.testing.assert_array_equal(np.asarray(size)[np.argsort(perm)], [4] * 12 + [0, 0])


def test_grouped_advantages_count_a_windowed_trajectory_once_and_zero_singletons():
    # trajectory 0 has two rows (its reward on the second), 1 and 2 are one row each; group
    # {0, 1} and a singleton {2}.
    rewards = np.array([[0, 0], [0, 3.0], [0, 1.0], [0, 5.0]], np.float32)
    mask = np.ones((4, 2), np.float32)
    traj = np.array([0, 0, 1, 2], np.int32)
    group = np.array([5, 5, 5, 8], np.int32)
    adv, size = grouped_advantages(rewards, mask, traj, group, normalize_std=False)
    np.testing.assert_allclose(np.asarray(adv)[:, 0], [1.0, 1.0, -1.0, 0.0])
    np.testing.assert_array_equal(size, [2, 2, 2, 1])


def test_prompt_group_ids_follow_the_first_prompt(tmp_path):
    shared = np.arange(3, 9)
    episodes = [
        episode("a", seed=1, prompt=shared, concat=False),
        episode("b", seed=2, prompt=shared, concat=False),
        episode("c", seed=3, concat=False),
    ]
    batch = first_batch(write_store(tmp_path, episodes), rows=12, seq_len=32, layout="windowed")
    ids = prompt_group_ids(batch)
    traj = batch["traj_index"]
    assert (ids[traj < 0] == -1).all() and (ids[traj >= 0] >= 0).all()
    by_traj = {int(k): set(ids[traj == k].tolist()) for k in set(traj[traj >= 0].tolist())}
    assert all(len(v) == 1 for v in by_traj.values())  # every row of a trajectory agrees
    assert by_traj[0] == by_traj[1] != by_traj[2]


@pytest.mark.parametrize("layout", ["concat", "windowed"])
def test_linked_gae_jits_with_static_shapes(layout, tmp_path):
    store = write_store(tmp_path, [episode(f"e{i}", seed=i, concat=False) for i in range(2)])
    batch = first_batch(store, rows=8, seq_len=32, layout=layout)
    fn = jax.jit(
        lambda b: linked_gae(
            b["rewards"], b["rewards"], b["loss_mask"], b["traj_index"], b["turn_index"], lam=0.9
        )
    )
    eager = linked_gae(
        batch["rewards"],
        batch["rewards"],
        batch["loss_mask"],
        batch["traj_index"],
        batch["turn_index"],
        lam=0.9,
    )
    jitted = fn({k: batch[k] for k in ("rewards", "loss_mask", "traj_index", "turn_index")})
    np.testing.assert_allclose(jitted[0], eager[0], rtol=1e-6)
