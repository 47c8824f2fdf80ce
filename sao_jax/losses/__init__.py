"""Pure-JAX RL objectives and advantage estimators: SAO (DIS + action-only GAE, linked across a
trajectory's rows, + value loss), SEED OPD, GRPO (group-relative advantages), PPO, KL.

Every function takes arrays and returns arrays; importing this package loads only jax, chex and
numpy, so any JAX training stack can use the objectives without adopting our trainer.
Conventions: per-token arrays are [B, T]; `mask` is 1 on action tokens; losses return
`(loss, metrics)` as float32 scalars and token means divide by `max(sum(mask), 1)`.
Formulas and sources: docs/losses.md.
"""

from sao_jax.losses.gae import (
    action_only_gae,
    adaptive_lambda,
    linked_gae,
    trajectory_action_counts,
)
from sao_jax.losses.grpo import group_advantages
from sao_jax.losses.kl import KL_KINDS, kl_estimate
from sao_jax.losses.logprobs import token_logprobs
from sao_jax.losses.masked import masked_token_mean, masked_whiten
from sao_jax.losses.ppo import ppo_clip_loss
from sao_jax.losses.registry import POLICY_LOSS_NAMES, PolicyLoss, get_policy_loss
from sao_jax.losses.sao import sao_policy_loss, sao_value_loss
from sao_jax.losses.seed import (
    OPD_MODES,
    SAMPLED_OPD_MODES,
    SKILL_KINDS,
    seed_distribution_loss,
    seed_gap_by_kind,
    seed_opd_loss,
)

__all__ = [
    "KL_KINDS",
    "OPD_MODES",
    "POLICY_LOSS_NAMES",
    "SAMPLED_OPD_MODES",
    "SKILL_KINDS",
    "PolicyLoss",
    "action_only_gae",
    "adaptive_lambda",
    "get_policy_loss",
    "group_advantages",
    "kl_estimate",
    "linked_gae",
    "masked_token_mean",
    "masked_whiten",
    "ppo_clip_loss",
    "sao_policy_loss",
    "sao_value_loss",
    "seed_distribution_loss",
    "seed_gap_by_kind",
    "seed_opd_loss",
    "token_logprobs",
    "trajectory_action_counts",
]
