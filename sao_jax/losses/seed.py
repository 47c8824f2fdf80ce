"""SEED stage-2 on-policy distillation from the policy's own skill-conditioned log-probs.

The teacher is the same policy re-scoring the same sampled tokens with a hindsight skill in its
context (`skill_logp`, arXiv 2607.14777; details secondary). The gated form only ever raises a
sampled token's probability; the signed form (OPID, same group) can also lower it. Both read
the teacher at the sampled tokens only; `seed_distribution_loss` reads its whole next-token
distribution (its top k and the rest), so what the teacher knows about tokens the policy did not
sample reaches the student too.
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

# gated / signed: a weight on each sampled token's log-prob (`seed_opd_loss`); kl: the forward
# KL from the teacher's next-token distribution at every action token (`seed_distribution_loss`)
OPD_MODES = ("gated", "signed", "kl")
SAMPLED_OPD_MODES = OPD_MODES[:2]
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
    if mode not in SAMPLED_OPD_MODES:
        raise ValueError(
            f"seed_opd_loss: mode must be one of {SAMPLED_OPD_MODES}, got {mode!r} (the KL over "
            "the teacher's distribution is seed_distribution_loss)"
        )
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


def seed_distribution_loss(
    student_logp: jax.Array,
    teacher_logp: jax.Array,
    mask: jax.Array,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Forward KL(teacher || student) over the teacher's top k next tokens and the rest.

    At each action token the teacher's next-token distribution (the policy with the skill in
    context) is kept as its k most likely tokens plus one bucket for the rest of the vocabulary;
    the student's log-probs of the same k tokens give its distribution over the same k + 1
    buckets, and the loss is their KL, token-mean over the action tokens:

      sum_i p_i (log p_i - log q_i) + p_rest (log p_rest - log q_rest),
      p_rest = 1 - sum_i p_i, q_rest = 1 - sum_i q_i.

    It is >= 0 and 0 exactly when the student gives each of the k tokens the teacher's
    probability (with k = V it is the whole forward KL). Unlike the sampled-token forms it
    moves probability towards tokens the student did not sample -- where a teacher that reads
    the skill knows the right command and the student does not, this is what carries it.

    Args:
      student_logp: [B, T, K] the policy's log-probs of the teacher's K tokens (differentiated;
        normalised over the whole vocabulary, `sao_jax.models.chunked_candidate_logprobs`).
      teacher_logp: [B, T, K] the teacher's log-probs of its K most likely tokens (never
        differentiated), distinct tokens.
      mask: [B, T] 1 on action tokens.
    Returns:
      (loss, metrics): float32 scalars over the action tokens: `kl` (the loss), `teacher_mass`
      / `student_mass` (the share of each distribution on the K tokens), `teacher_top1_logp` /
      `student_top1_logp` (the log-prob of the teacher's most likely token under each: its
      first column).
    """
    student_logp, teacher_logp = jnp.asarray(student_logp), jnp.asarray(teacher_logp)
    if student_logp.ndim != 3 or student_logp.shape != teacher_logp.shape:
        raise ValueError(
            "seed_distribution_loss: student_logp and teacher_logp must both be [B, T, K]; got "
            f"{student_logp.shape} and {teacher_logp.shape}"
        )
    check_token_arrays("seed_distribution_loss", mask=mask, top1=student_logp[..., 0])
    weights, active = float_mask(mask)
    cell = active[..., None]
    student = jnp.where(cell, student_logp.astype(jnp.float32), -1.0)
    teacher = jax.lax.stop_gradient(jnp.where(cell, teacher_logp.astype(jnp.float32), -1.0))
    # the rest bucket: 1 - sum exp(log-probs), from the log of the kept mass (at most 1)
    teacher_kept = jnp.minimum(jax.nn.logsumexp(teacher, axis=-1), 0.0)
    student_kept = jnp.minimum(jax.nn.logsumexp(student, axis=-1), -1e-6)
    teacher_rest = -jnp.expm1(teacher_kept)
    student_log_rest = jnp.log(-jnp.expm1(student_kept))
    probs = jnp.exp(teacher)
    per_token = jnp.sum(probs * (teacher - student), axis=-1) + (
        jax.scipy.special.xlogy(teacher_rest, teacher_rest) - teacher_rest * student_log_rest
    )
    num_tokens = token_count(weights)
    loss = masked_sum(per_token, weights, active) / num_tokens

    def mean(x):
        return masked_sum(x, weights, active) / num_tokens

    metrics = {
        "kl": loss,
        "teacher_mass": mean(jnp.exp(teacher_kept)),
        "student_mass": mean(jnp.exp(student_kept)),
        "teacher_top1_logp": mean(teacher[..., 0]),
        "student_top1_logp": mean(student[..., 0]),
    }
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
