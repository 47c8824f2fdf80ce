"""GRPO's group-relative advantage: each rollout scored against the other rollouts of its prompt."""

import operator

import chex
import jax
import jax.numpy as jnp

from sao_jax.losses.masked import check_hyperparameter


def group_advantages(
    rewards: jax.Array,
    group_size: int,
    *,
    normalize_std: bool = True,
    eps: float = 1e-6,
) -> jax.Array:
    """`(R - mean_group) / (std_group + eps)` (population std), or `R - mean_group`.

    Args:
      rewards: [N] one scalar reward per rollout; rows come in contiguous groups of
        `group_size` rollouts of the same prompt.
      group_size: G >= 1, a divisor of N (static: it fixes the [N / G, G] reshape).
      normalize_std: divide by the group's std (GRPO) or only subtract the mean (Dr. GRPO style).
      eps: > 0, keeps a group of equal rewards at advantage 0 instead of 0 / 0.

    Returns:
      [N] float32 advantages. Broadcast to tokens with `advantages[:, None] * mask`.
    """
    rewards = jnp.asarray(rewards)
    chex.assert_rank(rewards, 1, custom_message="group_advantages: rewards must be [N]")
    try:
        group_size = operator.index(group_size)
    except TypeError:
        raise ValueError(
            f"group_advantages: group_size must be a Python int, got {group_size!r}"
        ) from None
    num_rows = rewards.shape[0]
    if group_size < 1 or num_rows % group_size:
        raise ValueError(
            f"group_advantages: group_size={group_size} must be >= 1 and divide the "
            f"{num_rows} rows into whole groups"
        )
    grouped = rewards.astype(jnp.float32).reshape(num_rows // group_size, group_size)
    advantages = grouped - jnp.mean(grouped, axis=1, keepdims=True)
    if normalize_std:
        check_hyperparameter("group_advantages", "eps", eps, minimum=0.0, strict_minimum=True)
        advantages = advantages / (jnp.std(grouped, axis=1, keepdims=True) + eps)
    return advantages.reshape(num_rows)
