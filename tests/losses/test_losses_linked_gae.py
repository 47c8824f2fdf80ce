"""`linked_gae`: action-only GAE linked across a trajectory's rows, against GAE on the rows
concatenated; per-trajectory action counts; whitening over action tokens."""

import jax
import jax.numpy as jnp
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from sao_jax.losses import action_only_gae, linked_gae, masked_whiten, trajectory_action_counts


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


def test_trajectory_action_counts_sum_over_rows_and_ignore_padding():
    mask = np.array([[1, 1, 0], [0, 1, 0], [1, 1, 1], [1, 1, 1]], np.float32)
    traj = np.array([1, 1, 0, -1], np.int32)
    np.testing.assert_array_equal(trajectory_action_counts(mask, traj), [3, 3, 3, 0])


def test_masked_whiten_uses_only_the_masked_entries():
    x = jnp.array([[1.0, 3.0, 100.0], [5.0, 7.0, -50.0]])
    mask = jnp.array([[1, 1, 0], [1, 1, 0]])
    got = np.asarray(masked_whiten(x, mask))
    # masked entries 1, 3, 5, 7: mean 4, population std sqrt(5)
    want = (np.array([1.0, 3.0, 5.0, 7.0]) - 4.0) / (np.sqrt(5.0) + 1e-6)
    np.testing.assert_allclose(got[:, :2].reshape(-1), want, rtol=1e-6)
    assert np.all(got[:, 2] == 0)
    np.testing.assert_array_equal(masked_whiten(x, jnp.zeros_like(mask)), np.zeros((2, 3)))
