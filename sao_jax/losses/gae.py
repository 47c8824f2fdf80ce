"""Action-only GAE (SAO Eq. 4-5) and VAPO's length-adaptive lambda.

Observation, prompt and padding tokens are skipped: the TD error links the last token of one
action to the first token of the next, exactly as ordinary GAE over the row compacted to its
action tokens. One reverse `lax.scan` over T carries the next action token's value and advantage
and the reward waiting to be credited, so nothing is ever compacted or gathered.
"""

import chex
import jax
import jax.numpy as jnp

from sao_jax.losses.masked import check_hyperparameter, check_token_arrays, float_mask


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


def adaptive_lambda(num_action_tokens: jax.Array, alpha: float = 1.5) -> jax.Array:
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
