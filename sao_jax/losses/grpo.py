"""GRPO's group-relative advantage: each rollout scored against the other rollouts of its prompt."""

import chex
import jax
import jax.numpy as jnp

from sao_jax.losses.masked import check_hyperparameter


def group_advantages(
    returns: jax.Array,
    group_id: jax.Array,
    *,
    member: jax.Array | None = None,
    normalize_std: bool = True,
    eps: float = 1e-6,
) -> tuple[jax.Array, jax.Array]:
    """`(R - mean_group) / (std_group + eps)` (population std), or `R - mean_group`.

    Groups are named by id, need not be contiguous nor of one size, and are compared pairwise
    ([N, N]), so shapes stay static under `jit`. An entry whose group has fewer than two
    members gets advantage 0 (nothing to compare it with).

    Args:
      returns: [N] one scalar return per entry (a rollout, or a row of one).
      group_id: [N] int group of each entry (rollouts of one prompt share it), e.g.
        `jnp.arange(N) // G` for contiguous groups of G.
      member: [N] bool, the entries that count in their group's statistics (default: all):
        e.g. one row per rollout when a rollout spans several rows, none of the padding.
        Every entry is scored against its group's members, a non-member too.
      normalize_std: divide by the group's std (GRPO) or only subtract the mean (Dr. GRPO style).
      eps: > 0, keeps a group of equal returns at advantage 0 instead of 0 / 0.

    Returns:
      (advantages [N] float32, group_size [N] float32: the members of each entry's group).
      Broadcast to tokens with `advantages[:, None] * mask`.
    """
    returns = jnp.asarray(returns)
    group_id = jnp.asarray(group_id)
    chex.assert_rank(returns, 1, custom_message="group_advantages: returns must be [N]")
    chex.assert_shape(
        group_id,
        returns.shape,
        custom_message="group_advantages: group_id must be [N] like returns",
    )
    if normalize_std:
        check_hyperparameter("group_advantages", "eps", eps, minimum=0.0, strict_minimum=True)
    returns = returns.astype(jnp.float32)
    if member is None:
        member = jnp.ones(returns.shape, bool)
    else:
        member = jnp.asarray(member)
        chex.assert_shape(
            member, returns.shape, custom_message="group_advantages: member must be [N]"
        )
    members = ((group_id[:, None] == group_id[None, :]) & (member[None, :] != 0)).astype(
        jnp.float32
    )
    size = jnp.sum(members, axis=-1)
    safe_size = jnp.maximum(size, 1.0)
    mean = members @ returns / safe_size
    advantages = returns - mean
    if normalize_std:
        deviations = jnp.square(returns[None, :] - mean[:, None])
        variance = jnp.sum(members * deviations, axis=-1) / safe_size
        advantages = advantages / (jnp.sqrt(variance) + eps)
    return jnp.where(size > 1, advantages, 0.0), size
