"""The learner's objectives as functions of models and ATDP batches (traced inside the steps).

Token alignment: a batch row holds tokens [T] and `loss_mask` marks the tokens the policy
generated. Position t - 1 predicts token t, so log-probs, entropies and values are shifted one
step right: `logp[:, t]` is log pi(token t | tokens < t) and `values[:, t]` is the critic's value
of that same state (the prefix before token t). Column 0 predicts nothing and is never an action.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp

from sao_jax.losses import masked_token_mean, sao_value_loss, seed_opd_loss
from sao_jax.models import Critic, MoeAux, Transformer

Batch = Mapping[str, jax.Array]
Metrics = dict[str, jax.Array]


def _shift_right(x: jax.Array) -> jax.Array:
    """[R, T] -> [R, T] with column t holding x[:, t - 1] and column 0 zero."""
    return jnp.pad(x[:, :-1], ((0, 0), (1, 0)))


def action_mask(batch: Batch) -> jax.Array:
    """[R, T] float32 loss mask with column 0 cleared (no prediction exists for it)."""
    return batch["loss_mask"].astype(jnp.float32).at[:, 0].set(0.0)


def policy_logprobs(
    policy: Transformer, batch: Batch, *, chunk_size: int = 256
) -> tuple[jax.Array, jax.Array, MoeAux]:
    """(logp [R, T], entropy [R, T], MoE aux): log pi(token t | tokens < t) at temperature 1."""
    out = policy.forward(
        batch["tokens"], positions=batch["positions"], segment_ids=batch["segment_ids"]
    )
    targets = jnp.roll(batch["tokens"], -1, axis=1)
    logp, entropy = policy.token_logprobs(out.hidden, targets, chunk_size=chunk_size)
    return _shift_right(logp), _shift_right(entropy), out.aux


def critic_values(critic: Critic, batch: Batch) -> tuple[jax.Array, MoeAux]:
    """(values [R, T], MoE aux): V of the state before each token (its prefix)."""
    values, aux = critic.values_and_aux(
        batch["tokens"], positions=batch["positions"], segment_ids=batch["segment_ids"]
    )
    return _shift_right(values), aux


def aux_loss(aux: MoeAux, load_balance_weight: float, z_weight: float) -> jax.Array:
    """Weighted MoE auxiliary loss (scalar)."""
    return load_balance_weight * aux.load_balance_loss + z_weight * aux.router_z_loss


def policy_gradient_loss(
    policy: Transformer,
    batch: Batch,
    advantages: jax.Array,
    behaviour_logp: jax.Array,
    policy_loss: Callable[..., tuple[jax.Array, Metrics]],
    *,
    entropy_coef: float,
    load_balance_weight: float,
    z_weight: float,
    chunk_size: int,
    opd: Mapping[str, Any] | None = None,
) -> tuple[jax.Array, Metrics]:
    """The policy objective: `policy_loss(logp, behaviour_logp, A, mask)` + aux - entropy bonus.

    Args:
      advantages, behaviour_logp: [R, T] (behaviour: rollout log-probs or the old policy's).
      policy_loss: a `sao_jax.losses.get_policy_loss(...)` function.
      opd: SEED: `{"lambda": w, "beta": b, "mode": m, "clip": c}` adds
        `w * seed_opd_loss(logp, batch["skill_logp"], mask, ...)` (None: no such term).
    Returns:
      (loss, metrics) with the objective's metrics plus `entropy`, `load_balance_loss`,
      `router_z_loss`, `expert_dropped_fraction`, `policy_objective` (before aux terms), and
      with `opd`: `opd_loss`, `opd_delta_mean`, `opd_gate_mean` (or `opd_clip_frac`).
    """
    mask = action_mask(batch)
    logp, entropy, aux = policy_logprobs(policy, batch, chunk_size=chunk_size)
    objective, metrics = policy_loss(logp, behaviour_logp, advantages, mask)
    mean_entropy = masked_token_mean(entropy, mask)
    loss = objective + aux_loss(aux, load_balance_weight, z_weight) - entropy_coef * mean_entropy
    metrics = dict(metrics)
    if opd is not None:
        opd_value, opd_metrics = seed_opd_loss(
            logp, batch["skill_logp"], mask, beta=opd["beta"], mode=opd["mode"], clip=opd["clip"]
        )
        loss = loss + opd["lambda"] * opd_value
        metrics["opd_loss"] = opd_value
        metrics.update({f"opd_{k}": v for k, v in opd_metrics.items()})
    metrics.update(
        policy_objective=objective,
        entropy=jax.lax.stop_gradient(mean_entropy),
        load_balance_loss=aux.load_balance_loss,
        router_z_loss=aux.router_z_loss,
        expert_dropped_fraction=aux.dropped_fraction,
    )
    return loss, metrics


def value_loss(
    critic: Critic,
    batch: Batch,
    returns: jax.Array,
    old_values: jax.Array,
    *,
    value_clip: float | None,
    load_balance_weight: float,
    z_weight: float,
) -> tuple[jax.Array, Metrics]:
    """`sao_value_loss` of the critic on [R, T] `returns` (optionally clipped around
    `old_values`) plus the critic's own MoE aux loss."""
    mask = action_mask(batch)
    values, aux = critic_values(critic, batch)
    loss, metrics = sao_value_loss(
        values,
        returns,
        mask,
        old_values=old_values if value_clip is not None else None,
        value_clip=value_clip,
    )
    metrics = dict(metrics)
    metrics.update(load_balance_loss=aux.load_balance_loss, router_z_loss=aux.router_z_loss)
    return loss + aux_loss(aux, load_balance_weight, z_weight), metrics


def behaviour_cloning_loss(
    policy: Transformer,
    batch: Batch,
    *,
    load_balance_weight: float,
    z_weight: float,
    chunk_size: int,
    context_weight: float = 0.0,
) -> tuple[jax.Array, Metrics]:
    """Mean NLL of the action tokens (SFT on demonstrations) plus the MoE aux loss.

    `context_weight` > 0 adds that weight times the mean NLL of the other real tokens (prompts,
    observations, admissible-command lists): a language-modelling signal on every token that
    teaches a small model from scratch to read and copy the prompt far sooner than the few
    action tokens alone.
    """
    mask = action_mask(batch)
    logp, entropy, aux = policy_logprobs(policy, batch, chunk_size=chunk_size)
    nll = -masked_token_mean(logp, mask)
    context = (batch["segment_ids"] > 0).astype(jnp.float32).at[:, 0].set(0.0) * (1.0 - mask)
    context_nll = -masked_token_mean(logp, context)
    metrics = {
        "nll": nll,
        "context_nll": context_nll,
        "entropy": masked_token_mean(entropy, mask),
        "num_tokens": jnp.sum(mask),
        "load_balance_loss": aux.load_balance_loss,
        "router_z_loss": aux.router_z_loss,
    }
    loss = nll + context_weight * context_nll + aux_loss(aux, load_balance_weight, z_weight)
    return loss, metrics
