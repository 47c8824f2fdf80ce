"""SAO objectives: the DIS policy loss and the critic's value loss.

Sources: DIS is stated in the GLM-5 technical report (arXiv 2602.15763, sec. 4.1.2) and used by
SAO (arXiv 2607.07508); the value loss and optional PPO-style value clipping follow SAO / VAPO.
"""

import jax
import jax.numpy as jnp

from sao_jax.losses.masked import (
    check_hyperparameter,
    check_token_arrays,
    float_mask,
    masked_sum,
    stop_gradient_metrics,
    token_count,
    zero_outside,
)

Metrics = dict[str, jax.Array]

# DIS's ratio bounds (the defaults of `sao_policy_loss` and of the learner's `DisConfig`)
DIS_EPS_LOW = 0.3
DIS_EPS_HIGH = 5.0


def sao_policy_loss(
    logp: jax.Array,
    rollout_logp: jax.Array,
    advantages: jax.Array,
    mask: jax.Array,
    *,
    eps_low: float = DIS_EPS_LOW,
    eps_high: float = DIS_EPS_HIGH,
) -> tuple[jax.Array, Metrics]:
    """DIS: direct double-sided importance sampling against the rollout policy.

    `r = exp(sg(logp) - rollout_logp)`, `keep = mask * (1 - eps_low < r < 1 + eps_high)` (a hard
    mask, not a clamp), `loss = -sum(sg(r * keep * A) * logp) / max(sum(mask), 1)`. The gradient
    w.r.t. `logp` is `-r * A / N` on kept tokens and exactly 0 on dropped and masked ones; dropped
    tokens still count in N (slime's convention).

    Args:
      logp: [B, T] log-probs of the taken tokens under the policy being trained (differentiated).
      rollout_logp: [B, T] log-probs the sampler recorded at temperature 1.
      advantages: [B, T] per-token advantages (e.g. from `action_only_gae`).
      mask: [B, T] 1 on action tokens, 0 on prompt / observation / padding.
      eps_low: >= 0; tokens with r <= 1 - eps_low are dropped.
      eps_high: > 0; tokens with r >= 1 + eps_high are dropped.

    Returns:
      (loss, metrics): float32 scalars. Metrics: `clip_frac` = 1 - sum(keep) / sum(mask),
      `clip_low_frac`, `clip_high_frac` (the two sides of it), `ratio_mean` over the mask and
      `num_tokens` = sum(mask).
    """
    check_token_arrays(
        "sao_policy_loss",
        logp=logp,
        rollout_logp=rollout_logp,
        advantages=advantages,
        mask=mask,
    )
    check_hyperparameter("sao_policy_loss", "eps_low", eps_low, minimum=0.0)
    check_hyperparameter("sao_policy_loss", "eps_high", eps_high, minimum=0.0, strict_minimum=True)
    weights, active = float_mask(mask)
    logp = zero_outside(logp, active)
    rollout_logp = zero_outside(rollout_logp, active)
    advantages = zero_outside(advantages, active)

    ratio = jnp.exp(jax.lax.stop_gradient(logp) - rollout_logp)
    below = ratio <= 1.0 - eps_low
    above = ratio >= 1.0 + eps_high
    kept = active & ~below & ~above
    # `where`, not a product: a stale token's ratio may be inf, and inf * 0 would be NaN.
    coefficient = jax.lax.stop_gradient(jnp.where(kept, ratio * weights * advantages, 0.0))
    num_tokens = token_count(weights)
    loss = -masked_sum(coefficient * logp, 1.0, kept) / num_tokens

    metrics = {
        "clip_frac": masked_sum(1.0, weights, active & ~kept) / num_tokens,
        "clip_low_frac": masked_sum(1.0, weights, active & below) / num_tokens,
        "clip_high_frac": masked_sum(1.0, weights, active & above) / num_tokens,
        "ratio_mean": masked_sum(ratio, weights, active) / num_tokens,
        "num_tokens": jnp.sum(weights),
    }
    return loss, stop_gradient_metrics(metrics)


def sao_value_loss(
    values: jax.Array,
    returns: jax.Array,
    mask: jax.Array,
    *,
    old_values: jax.Array | None = None,
    value_clip: float | None = None,
) -> tuple[jax.Array, Metrics]:
    """Masked squared error of the critic, with optional PPO-style value clipping.

    `loss = sum(mask * e) / max(sum(mask), 1)` with `e = (V - R)^2`, or with `value_clip = c`:
    `e = max((V - R)^2, (V_old + clip(V - V_old, -c, c) - R)^2)`.

    Args:
      values: [B, T] critic predictions (differentiated).
      returns: [B, T] regression targets (e.g. `returns` of `action_only_gae`).
      mask: [B, T] 1 on action tokens.
      old_values: [B, T] the critic's predictions when the targets were computed; required by
        `value_clip`, ignored otherwise.
      value_clip: > 0, or None for no clipping.

    Returns:
      (loss, metrics): float32 scalars. Metrics: `explained_variance` = 1 - Var[R - V] / Var[R]
      over the mask (0 when Var[R] = 0), `value_mean`, `return_mean`, `value_clip_frac` (share
      of tokens where the clipped error was the larger one; 0 without clipping).
    """
    if value_clip is not None and old_values is None:
        raise ValueError(
            "sao_value_loss: value_clip needs old_values (the critic's predictions at the time the "
            "returns were computed)"
        )
    per_token_arrays = {"values": values, "returns": returns, "mask": mask}
    if old_values is not None:
        per_token_arrays["old_values"] = old_values
    check_token_arrays("sao_value_loss", **per_token_arrays)
    weights, active = float_mask(mask)
    values = zero_outside(values, active)
    returns = zero_outside(returns, active)
    num_tokens = token_count(weights)

    squared_error = jnp.square(values - returns)
    value_clip_frac = jnp.zeros((), jnp.float32)
    if value_clip is not None:
        check_hyperparameter(
            "sao_value_loss", "value_clip", value_clip, minimum=0.0, strict_minimum=True
        )
        old_values = zero_outside(old_values, active)
        clipped_values = old_values + jnp.clip(values - old_values, -value_clip, value_clip)
        clipped_error = jnp.square(clipped_values - returns)
        value_clip_frac = masked_sum(1.0, weights, active & (clipped_error > squared_error))
        value_clip_frac = value_clip_frac / num_tokens
        squared_error = jnp.maximum(squared_error, clipped_error)
    loss = masked_sum(squared_error, weights, active) / num_tokens

    metrics = {
        "explained_variance": _explained_variance(values, returns, weights, active, num_tokens),
        "value_mean": masked_sum(values, weights, active) / num_tokens,
        "return_mean": masked_sum(returns, weights, active) / num_tokens,
        "value_clip_frac": value_clip_frac,
    }
    return loss, stop_gradient_metrics(metrics)


def _explained_variance(values, returns, weights, active, num_tokens) -> jax.Array:
    """1 - Var[R - V] / Var[R] over the mask; 0 when the targets have no variance."""

    def masked_variance(x):
        mean = masked_sum(x, weights, active) / num_tokens
        return masked_sum(jnp.square(x - mean), weights, active) / num_tokens

    return_variance = masked_variance(returns)
    has_variance = return_variance > 0.0
    safe_variance = jnp.where(has_variance, return_variance, 1.0)
    return jnp.where(has_variance, 1.0 - masked_variance(returns - values) / safe_variance, 0.0)
