"""GAE linked across a trajectory's rows, adaptive lambda per trajectory, GRPO groups."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from train_factories import episode, first_batch, write_store

from sao_jax.losses import action_only_gae, adaptive_lambda, group_advantages
from sao_jax.train.advantages import (
    adaptive_row_lambda,
    grouped_advantages,
    linked_gae,
    prompt_group_ids,
    trajectory_action_counts,
)


def numpy_action_gae(r, v, m, gamma, lam):
    """Textbook GAE over the action tokens of one long row (rewards on other tokens credited to
    the preceding action token), in plain Python."""
    adv = np.zeros_like(r)
    next_value = next_adv = pending = 0.0
    for t in reversed(range(r.shape[0])):
        if m[t]:
            adv[t] = r[t] + pending + gamma * next_value - v[t] + gamma * lam * next_adv
            next_value, next_adv, pending = v[t], adv[t], 0.0
        else:
            pending += r[t]
    return adv, np.where(m > 0, adv + v, 0.0)


def concatenated_reference(rewards, values, mask, traj, turn, gamma, lam):
    """Each trajectory's rows concatenated in turn order, GAE on that long row, scattered back:
    the definition `linked_gae` must reproduce."""
    adv = np.zeros_like(rewards)
    ret = np.zeros_like(rewards)
    n = rewards.shape[1]
    for k in set(traj[traj >= 0].tolist()):
        rows = sorted(np.flatnonzero(traj == k), key=lambda r: turn[r])
        a, g = numpy_action_gae(
            *(np.concatenate([x[r] for r in rows]) for x in (rewards, values, mask)),
            gamma,
            float(lam[rows[0]]),
        )
        for i, r in enumerate(rows):
            adv[r], ret[r] = a[i * n : (i + 1) * n], g[i * n : (i + 1) * n]
    return adv, ret


@st.composite
def windowed_batches(draw):
    """Rows of a few trajectories in shuffled order, with padding rows, rows without actions,
    rewards before a row's first action and on non-action tokens."""
    rows, width = draw(st.integers(2, 7)), draw(st.integers(3, 8))
    rng = np.random.default_rng(draw(st.integers(0, 2**31)))
    num_traj = draw(st.integers(1, rows))
    traj = np.sort(rng.integers(0, num_traj, rows))
    traj[rng.random(rows) < 0.15] = -1
    turn = np.zeros(rows, np.int32)
    for k in set(traj[traj >= 0].tolist()):
        members = np.flatnonzero(traj == k)
        turn[members] = rng.permutation(len(members))
    turn[traj < 0] = -1
    perm = rng.permutation(rows)
    mask = (rng.random((rows, width)) < 0.5).astype(np.float32)
    rewards = np.where(rng.random((rows, width)) < 0.3, rng.normal(size=(rows, width)), 0.0)
    values = rng.normal(size=(rows, width))
    mask[traj < 0] = 0
    rewards[traj < 0] = 0
    lam_of_traj = rng.uniform(0.0, 1.0, num_traj)
    lam = np.where(traj >= 0, lam_of_traj[np.maximum(traj, 0)], 0.0)
    gamma = draw(st.sampled_from([1.0, 0.9]))
    arrays = [a[perm] for a in (rewards, values, mask, traj, turn, lam)]
    # Padded to one shape (padding rows, trailing non-action tokens) so one compile serves all.
    pad_rows, pad_cols = 8 - rows, 8 - width
    for i, a in enumerate(arrays):
        fill = -1 if i in (3, 4) else 0
        widths = ((0, pad_rows), (0, pad_cols)) if a.ndim == 2 else ((0, pad_rows),)
        arrays[i] = np.pad(a, widths, constant_values=fill)
    return (*(a.astype(np.float32 if a.dtype.kind == "f" else np.int32) for a in arrays), gamma)


_jitted_linked_gae = jax.jit(linked_gae, static_argnames="gamma")


@settings(max_examples=60, deadline=None)
@given(windowed_batches())
def test_linked_gae_equals_gae_on_concatenated_rows(case):
    rewards, values, mask, traj, turn, lam, gamma = case
    adv, ret = _jitted_linked_gae(rewards, values, mask, traj, turn, gamma=gamma, lam=lam)
    want_adv, want_ret = concatenated_reference(rewards, values, mask, traj, turn, gamma, lam)
    np.testing.assert_allclose(adv, want_adv, rtol=2e-5, atol=2e-5)
    np.testing.assert_allclose(ret, want_ret, rtol=2e-5, atol=2e-5)


def test_linked_gae_on_concat_rows_is_action_only_gae():
    rng = np.random.default_rng(3)
    rewards = rng.normal(size=(4, 9)).astype(np.float32)
    values = rng.normal(size=(4, 9)).astype(np.float32)
    mask = (rng.random((4, 9)) < 0.6).astype(np.float32)
    traj, turn = np.arange(4, dtype=np.int32), np.zeros(4, np.int32)
    got = linked_gae(rewards, values, mask, traj, turn, lam=0.8)
    want = action_only_gae(rewards, values, mask, lam=0.8)
    for row in range(4):  # and the plain-Python reference agrees with the library's GAE
        ref = numpy_action_gae(rewards[row], values[row], mask[row], 1.0, 0.8)[0]
        np.testing.assert_allclose(np.asarray(want[0])[row], ref, rtol=1e-5, atol=1e-6)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-6)


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
        lam = adaptive_row_lambda(mask, batch["traj_index"], 1.5)
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


def test_trajectory_action_counts_sum_over_rows_and_ignore_padding():
    mask = np.array([[1, 1, 0], [0, 1, 0], [1, 1, 1], [1, 1, 1]], np.float32)
    traj = np.array([1, 1, 0, -1], np.int32)
    np.testing.assert_array_equal(trajectory_action_counts(mask, traj), [3, 3, 3, 0])


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
    want = np.asarray(group_advantages(returns, group_size))
    got = np.asarray(adv)[np.argsort(perm)]
    np.testing.assert_allclose(got[: groups * group_size, 1], want, rtol=1e-5, atol=1e-6)
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
