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
# What a skill's sentences state (`sao_jax.seed.kinds`): a fact the episode revealed (ALFWorld:
# where an object was), a rule about a command that failed, the procedure that solves the task;
# "other": a skill none of whose sentences has a known form (e.g. a self-written word salad).
# A row's kinds are a bitmask over this order (bit k: SKILL_KINDS[k]; 0: the row has no skill).
SKILL_KINDS = ("fact", "failed_command", "procedure", "other")
GAP_QUANTILES = (0.1, 0.5, 0.9)


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
      (loss, metrics): float32 scalars. Metrics: the teacher-student gap `delta` over the action
      tokens: `delta_mean`, `delta_abs_mean`, `delta_std`, `delta_p10` / `delta_p50` /
      `delta_p90` (linear-interpolated quantiles, as `np.quantile`; 0 without action tokens);
      `gate_rate`: the share of action tokens the term pushes up (delta > 0: the gate is above
      1/2, the signed weight positive); and `gate_mean` (gated) or `clip_frac` (signed: share of
      tokens with |delta| > clip).
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

    metrics = gap_metrics(delta, weights, active)
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


def gap_metrics(delta: jax.Array, weights: jax.Array, active: jax.Array) -> dict[str, jax.Array]:
    """The distribution of the teacher-student gap `delta` [B, T] over the active tokens.

    Mean, mean |delta| and std are weighted by `weights`; the quantiles (`GAP_QUANTILES`, linear
    interpolation between order statistics as `np.quantile`) and `gate_rate` (share with
    delta > 0) count each active token once. Every value is 0 without an active token.
    """
    num_tokens = token_count(weights)
    mean = masked_sum(delta, weights, active) / num_tokens
    variance = masked_sum(jnp.square(delta - mean), weights, active) / num_tokens
    metrics = {
        "delta_mean": mean,
        "delta_abs_mean": masked_sum(jnp.abs(delta), weights, active) / num_tokens,
        "delta_std": jnp.sqrt(variance),
        "gate_rate": masked_sum(1.0, weights, active & (delta > 0)) / num_tokens,
    }
    flat_active = active.reshape(-1)
    # inactive entries sort last (+inf), so the first n entries are the active ones in order
    ordered = jnp.sort(jnp.where(flat_active, delta.reshape(-1), jnp.inf))
    count = jnp.sum(flat_active)
    for q in GAP_QUANTILES:
        position = q * jnp.maximum(count - 1, 0).astype(jnp.float32)
        low = jnp.floor(position).astype(jnp.int32)
        high = jnp.minimum(low + 1, jnp.maximum(count - 1, 0))
        fraction = position - low
        value = ordered[low] * (1.0 - fraction) + ordered[high] * fraction
        metrics[f"delta_p{round(q * 100):02d}"] = jnp.where(count > 0, value, 0.0)
    return metrics


def seed_gap_by_kind(
    logp: jax.Array,
    skill_logp: jax.Array,
    mask: jax.Array,
    row_kinds: jax.Array,
    kinds: tuple[str, ...] = SKILL_KINDS,
) -> dict[str, jax.Array]:
    """The mean teacher-student gap on the action tokens of rows whose skill has each kind.

    Args:
      logp, skill_logp, mask: as for `seed_opd_loss` ([B, T]).
      row_kinds: [B] int bitmask, bit k set when the row's skill holds a sentence of
        `kinds[k]` (0: no skill).
      kinds: names of the bits.
    Returns:
      float32 scalars, no gradient: `gap_<kind>` (NaN when no action token has that kind) and
      `kind_share_<kind>` (that kind's share of the action tokens).
    """
    check_token_arrays("seed_gap_by_kind", logp=logp, skill_logp=skill_logp, mask=mask)
    row_kinds = jnp.asarray(row_kinds)
    if row_kinds.shape != jnp.shape(logp)[:1]:
        raise ValueError(
            f"seed_gap_by_kind: row_kinds must be [B] = {jnp.shape(logp)[:1]}, got "
            f"{row_kinds.shape}"
        )
    weights, active = float_mask(mask)
    delta = zero_outside(skill_logp, active) - zero_outside(logp, active)
    num_tokens = token_count(weights)
    metrics = {}
    for bit, kind in enumerate(kinds):
        rows = ((row_kinds.astype(jnp.int32) >> bit) & 1) > 0
        selected = active & rows[:, None]
        tokens = masked_sum(1.0, weights, selected)
        gap = masked_sum(delta, weights, selected) / jnp.maximum(tokens, 1.0)
        metrics[f"gap_{kind}"] = jnp.where(tokens > 0, gap, jnp.nan)
        metrics[f"kind_share_{kind}"] = tokens / num_tokens
    return stop_gradient_metrics(metrics)
