"""PPO's clipped surrogate, with optional dual clip; GRPO uses it against behaviour log-probs."""

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

# exp(20) ~ 4.9e8 is far past any clip range; the bound only keeps a stale token's ratio (and
# the derivative the `max` discards) finite, as verl does.
_MAX_ABS_LOG_RATIO = 20.0
# The surrogate's clip range (the defaults of `ppo_clip_loss` and of the learner's `ClipConfig`)
CLIP_EPS_LOW = 0.2
CLIP_EPS_HIGH = 0.2


def ppo_clip_loss(
    logp: jax.Array,
    old_logp: jax.Array,
    advantages: jax.Array,
    mask: jax.Array,
    *,
    eps_low: float = CLIP_EPS_LOW,
    eps_high: float = CLIP_EPS_HIGH,
    dual_clip: float | None = None,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Token mean of `max(-A * r, -A * clip(r, 1 - eps_low, 1 + eps_high))`.

    `r = exp(logp - old_logp)`, with the log-ratio bounded to [-20, 20] before the exp. With
    `dual_clip = c > 1`, tokens with A < 0 take `min(that, -c * A)`.

    Args:
      logp: [B, T] log-probs under the policy being trained (differentiated).
      old_logp: [B, T] log-probs of the policy that the ratio is taken against (PPO: the policy
        before this update; GRPO: the behaviour / rollout policy).
      advantages: [B, T] per-token advantages.
      mask: [B, T] 1 on action tokens.
      eps_low: >= 0, lower clip range.
      eps_high: >= 0, upper clip range (raise it for DAPO's clip-higher).
      dual_clip: c > 1, or None.

    Returns:
      (loss, metrics): float32 scalars. Metrics: `clip_frac` (tokens whose clipped term is the
      larger, so they get no gradient), `dual_clip_frac`, `ratio_mean`, `approx_kl`
      (token mean of `r - 1 - log r`, a k3 estimate of KL(old || new)), `num_tokens`.
    """
    check_token_arrays(
        "ppo_clip_loss", logp=logp, old_logp=old_logp, advantages=advantages, mask=mask
    )
    check_hyperparameter("ppo_clip_loss", "eps_low", eps_low, minimum=0.0)
    check_hyperparameter("ppo_clip_loss", "eps_high", eps_high, minimum=0.0)
    if dual_clip is not None:
        check_hyperparameter(
            "ppo_clip_loss", "dual_clip", dual_clip, minimum=1.0, strict_minimum=True
        )
    weights, active = float_mask(mask)
    log_ratio = zero_outside(logp, active) - zero_outside(old_logp, active)
    log_ratio = jnp.clip(log_ratio, -_MAX_ABS_LOG_RATIO, _MAX_ABS_LOG_RATIO)
    advantages = zero_outside(advantages, active)

    ratio = jnp.exp(log_ratio)
    unclipped = -advantages * ratio
    clipped = -advantages * jnp.clip(ratio, 1.0 - eps_low, 1.0 + eps_high)
    per_token = jnp.maximum(unclipped, clipped)
    dual_clipped = jnp.zeros_like(active)
    if dual_clip is not None:
        dual_cap = -dual_clip * advantages
        dual_clipped = (advantages < 0.0) & (dual_cap < per_token)
        per_token = jnp.where(dual_clipped, dual_cap, per_token)
    num_tokens = token_count(weights)
    loss = masked_sum(per_token, weights, active) / num_tokens

    metrics = {
        "clip_frac": masked_sum(1.0, weights, active & (clipped > unclipped)) / num_tokens,
        "dual_clip_frac": masked_sum(1.0, weights, active & dual_clipped) / num_tokens,
        "ratio_mean": masked_sum(ratio, weights, active) / num_tokens,
        "approx_kl": masked_sum(ratio - 1.0 - log_ratio, weights, active) / num_tokens,
        "num_tokens": jnp.sum(weights),
    }
    return loss, stop_gradient_metrics(metrics)
