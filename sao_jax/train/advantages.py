"""Advantages over ATDP batches: action-only GAE linked across a trajectory's rows, GRPO groups.

A batch row is a whole trajectory (`concat` layout) or one LLM call of it (`windowed` layout;
`traj_index` names the trajectory, `turn_index` orders its calls). GAE must link the turns of
an episode through action tokens only, in both layouts. Concatenating a trajectory's rows in turn
order and running `action_only_gae` on that one long row would do it, but needs [R, R * T]
memory. Instead each row runs `action_only_gae` on its own, and the part of the recursion that
crosses a row boundary (the value, advantage and pending reward of the next row's first action
token) is carried by a reverse scan over the R rows sorted by (trajectory, turn). The result is
exactly the concatenation's (tested), with static shapes and O(R * T) memory.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping

import jax
import jax.numpy as jnp
import numpy as np

from sao_jax.losses import action_only_gae, adaptive_lambda


def trajectory_action_counts(mask: jax.Array, traj_index: jax.Array) -> jax.Array:
    """Action tokens of each row's whole trajectory, per row.

    Args:
      mask: [R, T] action-token mask; traj_index: [R] trajectory slot (-1: padding row).
    Returns:
      [R] float32: the sum of `mask` over every row of the row's trajectory (0 on padding rows).
    """
    rows = traj_index.shape[0]
    segment = jnp.where(traj_index >= 0, traj_index, rows)
    per_row = jnp.sum(mask.astype(jnp.float32), axis=-1)
    totals = jax.ops.segment_sum(per_row, segment, num_segments=rows + 1)
    return jnp.where(traj_index >= 0, totals[segment], 0.0)


def adaptive_row_lambda(mask: jax.Array, traj_index: jax.Array, alpha: float) -> jax.Array:
    """VAPO's length-adaptive lambda of each row's trajectory, [R] (L counted over all its rows)."""
    return adaptive_lambda(trajectory_action_counts(mask, traj_index), alpha)


def _row_order(traj_index: jax.Array, turn_index: jax.Array) -> jax.Array:
    """Permutation sorting rows by (trajectory, turn), padding rows last."""
    rows = traj_index.shape[0]
    big = jnp.int32(rows + 1)
    key = jnp.where(traj_index >= 0, traj_index, big) * (jnp.max(turn_index) + 2) + turn_index
    return jnp.argsort(key, stable=True)


def linked_gae(
    rewards: jax.Array,
    values: jax.Array,
    mask: jax.Array,
    traj_index: jax.Array,
    turn_index: jax.Array,
    *,
    gamma: float = 1.0,
    lam: float | jax.Array = 1.0,
) -> tuple[jax.Array, jax.Array]:
    """Action-only GAE over whole trajectories, whichever layout their rows come in.

    Equal to `action_only_gae` on each trajectory's rows concatenated in turn order. A reward
    sitting before a row's first action token is credited to the last action token of the
    trajectory's previous row (as in the concatenation); on a trajectory's first row it is
    dropped.

    Args:
      rewards, values, mask: [R, T] as for `action_only_gae` (values read on action tokens).
      traj_index: [R] int trajectory slot of each row (-1: padding row).
      turn_index: [R] int order of the row within its trajectory.
      gamma: scalar discount.
      lam: scalar or [R] lambda; rows of one trajectory must share it.
    Returns:
      (advantages, returns): [R, T] float32, 0 off the action tokens.
    """
    rows = rewards.shape[0]
    lam = jnp.broadcast_to(jnp.asarray(lam, jnp.float32), (rows,))
    is_action = mask != 0
    valid_row = traj_index >= 0
    is_action = is_action & valid_row[:, None]
    rewards = jnp.where(valid_row[:, None], rewards.astype(jnp.float32), 0.0)
    values = jnp.where(is_action, values.astype(jnp.float32), 0.0)
    local_adv, _ = action_only_gae(rewards, values, is_action, gamma=gamma, lam=lam)

    # Per-row summaries of what the previous row's last action token sees to its right.
    actions = is_action.astype(jnp.int32)
    num_actions = jnp.sum(actions, axis=-1)
    has_action = num_actions > 0
    first = jnp.argmax(is_action, axis=-1)
    before_first = jnp.arange(rewards.shape[1])[None, :] < first[:, None]
    lead_reward = jnp.sum(jnp.where(before_first | ~has_action[:, None], rewards, 0.0), axis=-1)
    first_value = jnp.take_along_axis(values, first[:, None], axis=-1)[:, 0]
    first_local_adv = jnp.take_along_axis(local_adv, first[:, None], axis=-1)[:, 0]
    decay = gamma * lam

    order = _row_order(traj_index, turn_index)
    sorted_traj = traj_index[order]
    same_as_next = jnp.concatenate([sorted_traj[:-1] == sorted_traj[1:], jnp.array([False])])
    same_as_next = same_as_next & (sorted_traj >= 0)

    def step(carry, row):
        v0, a0, lead, n, has, d, lam_row, linked = row
        # The carry is the next row's left end; a new trajectory starts from nothing.
        next_value, next_adv, pending = (jnp.where(linked, x, 0.0) for x in carry)
        # What the row's last action token would add with the rest of the trajectory known.
        incoming = pending + gamma * next_value + gamma * lam_row * next_adv
        left = (
            jnp.where(has, v0, next_value),
            jnp.where(has, a0 + d ** jnp.maximum(n - 1, 0) * incoming, next_adv),
            jnp.where(has, lead, pending + lead),
        )
        return left, incoming

    scanned = tuple(
        x[order]
        for x in (
            first_value,
            first_local_adv,
            lead_reward,
            num_actions.astype(jnp.float32),
            has_action,
            decay,
            lam,
        )
    )
    zero = jnp.zeros((), jnp.float32)
    _, incoming_sorted = jax.lax.scan(
        step, (zero, zero, zero), (*scanned, same_as_next), reverse=True
    )
    incoming = jnp.zeros_like(incoming_sorted).at[order].set(incoming_sorted)

    # Action tokens after t in its row: how far the boundary correction decays back to t.
    after = jnp.cumsum(actions[:, ::-1], axis=-1)[:, ::-1] - actions
    correction = decay[:, None] ** after.astype(jnp.float32) * incoming[:, None]
    advantages = jnp.where(is_action, local_adv + correction, 0.0)
    returns = jnp.where(is_action, advantages + values, 0.0)
    return advantages, returns


def whiten(x: jax.Array, mask: jax.Array, eps: float = 1e-6) -> jax.Array:
    """(x - mean) / (std + eps) over the masked entries of [R, T] `x`; 0 off the mask."""
    weights = (mask != 0).astype(jnp.float32)
    count = jnp.maximum(jnp.sum(weights), 1.0)
    mean = jnp.sum(x * weights) / count
    std = jnp.sqrt(jnp.sum(jnp.square(x - mean) * weights) / count)
    return jnp.where(weights > 0, (x - mean) / (std + eps), 0.0)


# -- GRPO groups ---------------------------------------------------------------------------------


def prompt_group_ids(batch: Mapping[str, np.ndarray]) -> np.ndarray:
    """Group id of each row: rollouts of the same prompt share one (host-side, numpy).

    The prompt of a trajectory is its first row's tokens before its first action token (the
    harness prompt of the episode's first turn), so groups come from the data itself. The id is
    a 31-bit hash of those tokens, the same on every host; padding rows get -1.

    Args:
      batch: an ATDP loader batch (`tokens`, `loss_mask`, `segment_ids`, `traj_index`,
        `turn_index`).
    Returns:
      [R] int32.
    """
    traj, turn = batch["traj_index"], batch["turn_index"]
    first_row: dict[int, int] = {}
    for row in np.flatnonzero(traj >= 0):
        k = int(traj[row])
        if k not in first_row or turn[row] < turn[first_row[k]]:
            first_row[k] = int(row)
    group_of_traj = {}
    for k, row in first_row.items():
        actions = np.flatnonzero(batch["loss_mask"][row])
        end = int(actions[0]) if actions.size else int(batch["segment_ids"][row].sum())
        digest = hashlib.blake2b(batch["tokens"][row, :end].astype("<i4").tobytes(), digest_size=4)
        group_of_traj[k] = int.from_bytes(digest.digest(), "little") & 0x7FFFFFFF
    return np.asarray([group_of_traj.get(int(k), -1) for k in traj], np.int32)


def trajectory_returns(rewards: jax.Array, traj_index: jax.Array) -> jax.Array:
    """[R, T], [R] -> [R]: the summed rewards of each row's whole trajectory (0 on padding)."""
    valid = traj_index >= 0
    same = (traj_index[:, None] == traj_index[None, :]) & valid[:, None] & valid[None, :]
    return same.astype(jnp.float32) @ jnp.sum(rewards.astype(jnp.float32), axis=-1)


def grouped_advantages(
    rewards: jax.Array,
    mask: jax.Array,
    traj_index: jax.Array,
    group_id: jax.Array,
    *,
    normalize_std: bool = True,
    eps: float = 1e-6,
) -> tuple[jax.Array, jax.Array]:
    """GRPO advantages on action tokens, for groups of any size within the batch.

    Each trajectory's return R (its summed rewards) is scored against the trajectories of its
    group in the batch: `(R - mean_group) / (std_group + eps)` (population std), or
    `R - mean_group`. Equals `sao_jax.losses.group_advantages` when every group is complete; a
    trajectory alone in its group gets advantage 0 (nothing to compare it with). Pairwise
    [R, R] comparisons keep shapes static with ids that need not be dense.

    Args:
      rewards, mask: [R, T]; traj_index: [R] (-1 padding); group_id: [R] group of each row's
        trajectory (from `prompt_group_ids`; -1 padding).
    Returns:
      (advantages [R, T] float32 on action tokens, group_size [R] float32: trajectories of the
      row's group present in the batch).
    """
    rows = traj_index.shape[0]
    valid = traj_index >= 0
    returns = trajectory_returns(rewards, traj_index)
    same_traj = traj_index[:, None] == traj_index[None, :]
    earlier = jnp.tril(jnp.ones((rows, rows), bool), k=-1)
    # One representative row per trajectory: its first row in the batch.
    representative = valid & ~jnp.any(same_traj & earlier, axis=-1)
    members = (group_id[:, None] == group_id[None, :]) & representative[None, :] & valid[:, None]
    members = members.astype(jnp.float32)
    size = jnp.sum(members, axis=-1)
    safe_size = jnp.maximum(size, 1.0)
    mean = members @ returns / safe_size
    centred = returns - mean
    if normalize_std:
        deviations = jnp.square(returns[None, :] - mean[:, None])
        variance = jnp.sum(members * deviations, axis=-1) / safe_size
        centred = centred / (jnp.sqrt(variance) + eps)
    row_advantage = jnp.where(valid & (size > 1), centred, 0.0)
    advantages = jnp.where((mask != 0) & valid[:, None], row_advantage[:, None], 0.0)
    return advantages, size
