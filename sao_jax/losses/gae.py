"""Action-only GAE (SAO Eq. 4-5), linked across the rows of a trajectory, and VAPO's
length-adaptive lambda.

Observation, prompt and padding tokens are skipped: the TD error links the last token of one
action to the first token of the next, exactly as ordinary GAE over the row compacted to its
action tokens. One reverse `lax.scan` over T carries the next action token's value and advantage
and the reward waiting to be credited, so nothing is ever compacted or gathered.

A batch row is a whole trajectory (`concat` layout) or one LLM call of it (`windowed` layout;
`traj_index` names the trajectory, `turn_index` orders its calls). `linked_gae` links the turns
of an episode through action tokens only, in both layouts. Concatenating a trajectory's rows in
turn order and running `action_only_gae` on that one long row would do it, but needs [R, R * T]
memory. Instead each row runs `action_only_gae` on its own, and the part of the recursion that
crosses a row boundary (the value, advantage and pending reward of the next row's first action
token) is carried by a reverse scan over the R rows sorted by (trajectory, turn). The result is
exactly the concatenation's (tested), with static shapes and O(R * T) memory.
"""

import chex
import jax
import jax.numpy as jnp

from sao_jax.losses.masked import check_hyperparameter, check_token_arrays, float_mask

ADAPTIVE_LAMBDA_ALPHA = 1.5  # as read for SAO (secondary); VAPO itself uses 0.05


def action_only_gae(
    rewards: jax.Array,
    values: jax.Array,
    mask: jax.Array,
    *,
    gamma: float | jax.Array = 1.0,
    lam: float | jax.Array = 1.0,
) -> tuple[jax.Array, jax.Array]:
    """GAE over each row's action tokens only, with value 0 after the last one.

    Per row, with a_1 .. a_n its action tokens in order:
    `delta_i = r_i + gamma * V(a_{i+1}) - V(a_i)` (`V(a_{n+1}) = 0`),
    `A_i = delta_i + gamma * lam * A_{i+1}`, `returns_i = A_i + V(a_i)`. A reward on a non-action
    token is added to the nearest preceding action token of its row, or dropped if there is none.

    A trajectory split over several rows (the `windowed` ATDP layout) is handled by concatenating
    its rows in turn order into one row first: the repeated prompt tokens are non-action tokens,
    so they are skipped and the turns link up as they should.

    Args:
      rewards: [B, T] rewards, usually nonzero only on the last token of an action; padding must
        carry 0 (it is credited like any non-action token).
      values: [B, T] critic values; read only on action tokens.
      mask: [B, T] nonzero on action tokens.
      gamma: discount, scalar or [B], in [0, 1].
      lam: GAE lambda, scalar or [B] (e.g. `adaptive_lambda(...)`), in [0, 1].

    Returns:
      (advantages, returns): [B, T] float32 each, 0 on non-action tokens.
    """
    check_token_arrays("action_only_gae", rewards=rewards, values=values, mask=mask)
    batch = jnp.shape(rewards)[0]
    gamma = _per_row("gamma", gamma, batch)
    lam = _per_row("lam", lam, batch)
    _, is_action = float_mask(mask)
    rewards = jnp.asarray(rewards).astype(jnp.float32)
    values = jnp.where(is_action, jnp.asarray(values).astype(jnp.float32), 0.0)

    def step(carry, token):
        next_value, next_advantage, pending_reward = carry
        reward, value, action = token
        credited_reward = reward + pending_reward
        delta = credited_reward + gamma * next_value - value
        advantage = delta + gamma * lam * next_advantage
        carry = (
            jnp.where(action, value, next_value),
            jnp.where(action, advantage, next_advantage),
            # An action token absorbs the rewards that followed it; otherwise keep accumulating.
            jnp.where(action, 0.0, credited_reward),
        )
        return carry, jnp.where(action, advantage, 0.0)

    zeros = jnp.zeros((batch,), jnp.float32)
    time_major = (rewards.T, values.T, is_action.T)
    _, advantages = jax.lax.scan(step, (zeros, zeros, zeros), time_major, reverse=True)
    advantages = advantages.T
    returns = jnp.where(is_action, advantages + values, 0.0)
    return advantages, returns


def adaptive_lambda(
    num_action_tokens: jax.Array, alpha: float = ADAPTIVE_LAMBDA_ALPHA
) -> jax.Array:
    """VAPO's length-adaptive GAE lambda: `clip(1 - 1 / (alpha * L), 0, 1)`, 0 when L = 0.

    Args:
      num_action_tokens: [B] (or any shape) action-token count L of each trajectory, e.g.
        `mask.sum(-1)` in the `concat` layout.
      alpha: > 0. 1.5 as read for SAO (secondary); VAPO itself uses 0.05.

    Returns:
      float32 array shaped like `num_action_tokens`, usable as `action_only_gae(..., lam=...)`.
    """
    check_hyperparameter("adaptive_lambda", "alpha", alpha, minimum=0.0, strict_minimum=True)
    length = jnp.asarray(num_action_tokens).astype(jnp.float32)
    has_actions = length > 0
    safe_length = jnp.where(has_actions, length, 1.0)
    lam = jnp.clip(1.0 - 1.0 / (alpha * safe_length), 0.0, 1.0)
    return jnp.where(has_actions, lam, 0.0)


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


def _per_row(name: str, value, batch: int) -> jax.Array:
    """A scalar or [B] hyperparameter as a checked float32 [B] array."""
    check_hyperparameter("action_only_gae", name, value, minimum=0.0, maximum=1.0)
    value = jnp.asarray(value).astype(jnp.float32)
    if value.ndim != 0:
        chex.assert_shape(
            value,
            (batch,),
            custom_message=f"action_only_gae: {name} must be a scalar or [B] = [{batch}]",
        )
    return jnp.broadcast_to(value, (batch,))
