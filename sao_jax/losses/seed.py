"""SEED stage-2 on-policy distillation from the policy's own skill-conditioned log-probs.

The teacher is the same policy re-scoring the same sampled tokens with a hindsight skill in its
context (`skill_logp`, arXiv 2607.14777; details secondary). The gated form only ever raises a
sampled token's probability; the signed form (OPID, same group) can also lower it.
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

OPD_MODES = ("gated", "signed")
OPD_BETA = 5.0  # the gate's sharpness (default of `seed_opd_loss` and the learner's `OpdConfig`)


def seed_opd_loss(
    logp: jax.Array,
    skill_logp: jax.Array,
    mask: jax.Array,
    *,
    beta: float = OPD_BETA,
    mode: str = OPD_MODES[0],
    clip: float | None = None,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Self-distillation towards the skill-conditioned policy, `delta = sg(skill_logp - logp)`.

    gated: `g = sigmoid(beta * delta)`, `loss = sum(mask * g * (sg(skill_logp) - logp)) / N`,
    whose gradient is `-g / N * grad logp`.
    signed: `loss = -sum(mask * d * logp) / N` with `d = delta`, clipped to [-clip, clip] when
    `clip` is given. `N = max(sum(mask), 1)`.

    Args:
      logp: [B, T] log-probs of the sampled tokens under the policy (differentiated).
      skill_logp: [B, T] log-probs of the same tokens with the skill in context (the teacher;
        never differentiated).
      mask: [B, T] 1 on action tokens.
      beta: >= 0, gate sharpness (gated mode only).
      mode: "gated" or "signed".
      clip: > 0 bound on |delta| (signed mode only), or None.

    Returns:
      (loss, metrics): float32 scalars. Metrics: `delta_mean`, `delta_abs_mean`, and
      `gate_mean` (gated) or `clip_frac` (signed: share of tokens with |delta| > clip).
    """
    if mode not in OPD_MODES:
        raise ValueError(f"seed_opd_loss: mode must be one of {OPD_MODES}, got {mode!r}")
    if mode == "gated" and clip is not None:
        raise ValueError("seed_opd_loss: clip applies only to mode='signed'; the gate is bounded")
    check_token_arrays("seed_opd_loss", logp=logp, skill_logp=skill_logp, mask=mask)
    weights, active = float_mask(mask)
    logp = zero_outside(logp, active)
    skill_logp = jax.lax.stop_gradient(zero_outside(skill_logp, active))
    delta = jax.lax.stop_gradient(skill_logp - logp)
    num_tokens = token_count(weights)

    metrics = {
        "delta_mean": masked_sum(delta, weights, active) / num_tokens,
        "delta_abs_mean": masked_sum(jnp.abs(delta), weights, active) / num_tokens,
    }
    if mode == "gated":
        check_hyperparameter("seed_opd_loss", "beta", beta, minimum=0.0)
        gate = jax.nn.sigmoid(beta * delta)
        per_token = gate * (skill_logp - logp)
        metrics["gate_mean"] = masked_sum(gate, weights, active) / num_tokens
    else:
        signed_weight = delta
        clipped = jnp.zeros_like(active)
        if clip is not None:
            check_hyperparameter("seed_opd_loss", "clip", clip, minimum=0.0, strict_minimum=True)
            signed_weight = jnp.clip(delta, -clip, clip)
            clipped = jnp.abs(delta) > clip
        per_token = -signed_weight * logp
        metrics["clip_frac"] = masked_sum(1.0, weights, active & clipped) / num_tokens
    loss = masked_sum(per_token, weights, active) / num_tokens
    return loss, stop_gradient_metrics(metrics)
