"""Loader batches to the advantage estimators of `sao_jax.losses`: the host-side prompt group
of each row, each row's trajectory return, and GRPO advantages broadcast to a batch's tokens.

The estimators themselves (`linked_gae`, `group_advantages`, ...) are pure array functions in
`sao_jax.losses`; this module only maps a batch's rows (several per trajectory in the
`windowed` layout, padding rows with `traj_index` -1) onto them.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping

import jax
import jax.numpy as jnp
import numpy as np

from sao_jax.losses import group_advantages


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
) -> tuple[jax.Array, jax.Array]:
    """GRPO advantages (`sao_jax.losses.group_advantages`) on a batch's action tokens.

    Each trajectory's return R (its summed rewards over all its rows) counts once in its group
    (through its first row in the batch); every row of it gets its advantage.

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
    first_row = valid & ~jnp.any(same_traj & earlier, axis=-1)
    row_advantage, size = group_advantages(
        returns, group_id, member=first_row, normalize_std=normalize_std
    )
    advantages = jnp.where((mask != 0) & valid[:, None], row_advantage[:, None], 0.0)
    return advantages, jnp.where(valid, size, 0.0)
