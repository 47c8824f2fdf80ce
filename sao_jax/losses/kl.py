"""Per-token KL estimators between the policy and a reference policy, token-averaged.

Schulman's k1 / k2 / k3 estimators of KL(pi || ref) from samples of pi: k1 is unbiased but
high-variance and can be negative; k3 is unbiased, always >= 0 and low-variance (GRPO's choice).
"""

import jax
import jax.numpy as jnp

from sao_jax.losses.masked import (
    check_token_arrays,
    float_mask,
    masked_sum,
    stop_gradient_metrics,
    token_count,
    zero_outside,
)

KL_KINDS = ("k1", "k2", "k3")


def kl_estimate(
    logp: jax.Array, ref_logp: jax.Array, mask: jax.Array, kind: str = "k3"
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Token mean of a KL(pi || ref) estimator, usable as a penalty `beta_kl * kl`.

    With `x = logp - ref_logp`: k1 = `x`, k2 = `0.5 * x^2`, k3 = `exp(-x) + x - 1`
    (= `exp(ref - logp) - (ref - logp) - 1`). Not clamped: a k3 term overflowing to inf means
    the policy has left the reference's support and should be seen, not hidden.

    Args:
      logp: [B, T] log-probs of the sampled tokens under the policy (differentiated).
      ref_logp: [B, T] log-probs of the same tokens under the reference policy.
      mask: [B, T] 1 on action tokens.
      kind: "k1", "k2" or "k3".

    Returns:
      (kl, metrics): float32 scalars. Metrics: `kl_k1`, `kl_k2`, `kl_k3`, all three estimators,
      so a run can watch them whichever one it optimises.
    """
    if kind not in KL_KINDS:
        raise ValueError(f"kl_estimate: kind must be one of {KL_KINDS}, got {kind!r}")
    check_token_arrays("kl_estimate", logp=logp, ref_logp=ref_logp, mask=mask)
    weights, active = float_mask(mask)
    log_ratio = zero_outside(logp, active) - zero_outside(ref_logp, active)
    estimators = {
        "k1": log_ratio,
        "k2": 0.5 * jnp.square(log_ratio),
        "k3": jnp.exp(-log_ratio) + log_ratio - 1.0,
    }
    num_tokens = token_count(weights)
    means = {
        name: masked_sum(per_token, weights, active) / num_tokens
        for name, per_token in estimators.items()
    }
    metrics = {f"kl_{name}": value for name, value in means.items()}
    return means[kind], stop_gradient_metrics(metrics)
