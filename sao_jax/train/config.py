"""Typed learner configuration: optimizers, trainable-parameter patterns, algorithm knobs.

Plain dataclasses, so an experiment can nest them in its own config and override any field
from the command line (`learner.critic_steps=4`, `learner.policy_optimizer.learning_rate=3e-5`).
"""

from __future__ import annotations

import dataclasses
import re

from sao_jax.models.config import MoeAuxConfig
from sao_jax.train.algorithms import get_algorithm

# Paths are "/"-joined nnx paths: `embed/embedding`, `layers/0/attn/q_proj/kernel`,
# `layers/0/moe/experts/gate_proj`, `layers/1/mlp/up_proj/kernel`, `value_head/kernel`.
ALL_PARAMETERS: tuple[str, ...] = (".*",)
# SAO's critic: attention (and embeddings / norms) frozen, MoE / MLP projections + head train.
CRITIC_FFN_AND_HEAD: tuple[str, ...] = (r"(^|/)(moe|mlp)/", r"^value_head/")


@dataclasses.dataclass
class OptimizerConfig:
    """AdamW with linear warm-up and global-norm gradient clipping.

    Attributes:
      learning_rate: peak learning rate.
      warmup_steps: optimizer steps of linear warm-up from 0 to the peak (0: none).
      b1: Adam first-moment decay.
      b2: Adam second-moment decay.
      eps: Adam epsilon.
      weight_decay: decoupled weight decay (AdamW).
      max_grad_norm: clip the global gradient norm to this (<= 0: no clipping).
      decay_steps: optimizer steps after the warm-up over which the rate follows a cosine from
        the peak down to `final_fraction` of it, then stays there (0: constant after warm-up).
      final_fraction: the rate at the end of the decay, as a fraction of the peak.
    """

    learning_rate: float = 1e-4
    warmup_steps: int = 0
    b1: float = 0.9
    b2: float = 0.99
    eps: float = 1e-8
    weight_decay: float = 0.0
    max_grad_norm: float = 1.0
    decay_steps: int = 0
    final_fraction: float = 0.1

    def __post_init__(self):
        if not self.learning_rate > 0:
            raise ValueError(f"learning_rate must be > 0, got {self.learning_rate}")
        if self.warmup_steps < 0 or self.decay_steps < 0:
            raise ValueError(
                f"warmup_steps and decay_steps must be >= 0, got {self.warmup_steps}, "
                f"{self.decay_steps}"
            )
        if not 0 <= self.final_fraction <= 1:
            raise ValueError(f"final_fraction must be in [0, 1], got {self.final_fraction}")
        for name in ("b1", "b2"):
            if not 0 <= getattr(self, name) < 1:
                raise ValueError(f"{name} must be in [0, 1), got {getattr(self, name)}")


@dataclasses.dataclass
class LearnerConfig:
    """What the learner optimises and how.

    Attributes:
      algorithm: "sao", "grpo", "grpo_dis", "ppo" (see sao_jax.train.algorithms.ALGORITHMS).
      policy_optimizer: optimizer of the policy's trainable parameters.
      critic_optimizer: optimizer of the critic's trainable parameters.
      policy_trainable: regexes (searched in "/"-joined nnx paths) of policy parameters that
        train; the rest stay frozen.
      critic_trainable: regexes of critic parameters that train (SAO: MoE / MLP and value head).
      eps_low: DIS lower bound: tokens with rollout ratio <= 1 - eps_low get no gradient.
      eps_high: DIS upper bound: tokens with rollout ratio >= 1 + eps_high get no gradient.
      clip_eps_low: lower clip range of the PPO / GRPO surrogate.
      clip_eps_high: upper clip range of the PPO / GRPO surrogate.
      critic_steps: critic gradient steps per policy step (K; SAO: 2).
      critic_warmup_steps: critic-only iterations before the first policy step.
      ppo_epochs: policy steps per batch for PPO (its ratio is against the policy at the
        start of the iteration, so one step would never clip).
      gamma: discount per action token.
      lam_alpha: length-adaptive policy lambda = clip(1 - 1 / (lam_alpha * L), 0, 1), L the
        trajectory's action tokens.
      policy_lam: a fixed policy lambda instead of the adaptive one (None: adaptive).
      critic_lam: lambda of the critic's targets (1: Monte-Carlo returns).
      value_clip: PPO-style value clipping range of the critic loss (None: off).
      group_size: GRPO rollouts per prompt (G), used to check batches hold whole groups.
      group_normalize_std: GRPO advantages divided by the group's std (False: mean only).
      normalize_advantages: whiten GAE advantages over the batch's action tokens.
      entropy_coef: weight of an entropy bonus on the policy (0: none).
      moe: weights of the MoE auxiliary losses (policy and critic).
      reset_optimizer_on_sync: re-initialise the policy optimizer state whenever weights are
        published to the rollout workers.
      logprob_chunk_size: sequence chunk of the log-prob computation (memory of [B, chunk, V]).
      head_positions: where the RL steps run the LM head and the value head: "actions" (only
        at the action tokens, the only positions the losses read; same results) or "all"
        (every position, the reference path).
      max_action_tokens_per_row: with head_positions="actions", the static per-row capacity K
        of gathered action tokens (a batch with a fuller row is refused); None: K follows each
        batch (its fullest row, bucketed; a few compiled shapes).
      opd_lambda: weight of SEED's on-policy distillation term (algorithms with `opd`).
      opd_beta: gate sharpness of the gated OPD form.
      opd_mode: "gated" (never lowers a sampled token's probability) or "signed" (OPID).
      opd_clip: bound on |skill_logp - logp| of the signed form (None: unbounded).
      pack_rows: run the backbone on the batch's real tokens only, its rows packed several
        to a row of the batch's length (`sao_jax.train.packing`; results are read back in the
        batch's own layout, so losses and advantages are unchanged), and a learner iteration
        drops the rows that hold no token (`packing.compact_rows`), so the heads, GAE and the
        losses run on real rows only; False: every row as the loader padded it.
      pack_row_multiple: the packed row count is rounded up to this multiple times one of
        1, 2, 3, 4, 6, 8, 12, ... (`packing.bucket_rows`: each count is a compiled shape, so a
        run compiles a few, at the price of at most a third of the packed rows padding).
      fused_iteration: run an iteration as one compiled program (values, advantages, the
        policy step(s) and the critic steps under `lax.scan`); False: the step-by-step
        reference path (`prepare`, each policy step, each critic step jitted apart and
        called from Python). Same results; see docs/training.md.
    """

    algorithm: str = "sao"
    policy_optimizer: OptimizerConfig = dataclasses.field(default_factory=OptimizerConfig)
    critic_optimizer: OptimizerConfig = dataclasses.field(
        default_factory=lambda: OptimizerConfig(learning_rate=3e-4)
    )
    policy_trainable: tuple[str, ...] = ALL_PARAMETERS
    critic_trainable: tuple[str, ...] = CRITIC_FFN_AND_HEAD
    eps_low: float = 0.3
    eps_high: float = 5.0
    clip_eps_low: float = 0.2
    clip_eps_high: float = 0.2
    critic_steps: int = 2
    critic_warmup_steps: int = 10
    ppo_epochs: int = 2
    gamma: float = 1.0
    lam_alpha: float = 1.5
    policy_lam: float | None = None
    critic_lam: float = 1.0
    value_clip: float | None = None
    group_size: int = 4
    group_normalize_std: bool = True
    normalize_advantages: bool = False
    entropy_coef: float = 0.0
    moe: MoeAuxConfig = dataclasses.field(default_factory=MoeAuxConfig)
    reset_optimizer_on_sync: bool = False
    logprob_chunk_size: int = 256
    head_positions: str = "actions"
    max_action_tokens_per_row: int | None = None
    opd_lambda: float = 0.01
    opd_beta: float = 5.0
    opd_mode: str = "gated"
    opd_clip: float | None = None
    pack_rows: bool = True
    pack_row_multiple: int = 8
    fused_iteration: bool = True

    def __post_init__(self):
        get_algorithm(self.algorithm)
        names = ("critic_steps", "ppo_epochs", "group_size", "logprob_chunk_size")
        for name in (*names, "pack_row_multiple"):
            if getattr(self, name) < 1:
                raise ValueError(f"LearnerConfig.{name} must be >= 1, got {getattr(self, name)}")
        if self.head_positions not in ("actions", "all"):
            raise ValueError(
                f"LearnerConfig.head_positions must be 'actions' or 'all', got "
                f"{self.head_positions!r}"
            )
        if self.max_action_tokens_per_row is not None and self.max_action_tokens_per_row < 1:
            raise ValueError(
                "LearnerConfig.max_action_tokens_per_row must be >= 1 or None, got "
                f"{self.max_action_tokens_per_row}"
            )
        if self.critic_warmup_steps < 0:
            raise ValueError(
                f"LearnerConfig.critic_warmup_steps must be >= 0, got {self.critic_warmup_steps}"
            )
        for name in ("gamma", "critic_lam"):
            if not 0 <= getattr(self, name) <= 1:
                raise ValueError(
                    f"LearnerConfig.{name} must be in [0, 1], got {getattr(self, name)}"
                )
        if self.policy_lam is not None and not 0 <= self.policy_lam <= 1:
            raise ValueError(f"LearnerConfig.policy_lam must be in [0, 1], got {self.policy_lam}")
        if self.opd_lambda < 0 or self.opd_beta < 0:
            raise ValueError(
                f"LearnerConfig.opd_lambda / opd_beta must be >= 0, got {self.opd_lambda} / "
                f"{self.opd_beta}"
            )
        if self.opd_mode not in ("gated", "signed"):
            raise ValueError(
                f"LearnerConfig.opd_mode must be gated or signed, got {self.opd_mode!r}"
            )
        if self.opd_clip is not None and (self.opd_mode != "signed" or self.opd_clip <= 0):
            raise ValueError("LearnerConfig.opd_clip must be > 0 and needs opd_mode='signed'")
        if self.value_clip is not None and self.value_clip <= 0:
            raise ValueError(f"LearnerConfig.value_clip must be > 0 or None, got {self.value_clip}")
        for name in ("policy_trainable", "critic_trainable"):
            for pattern in getattr(self, name):
                try:
                    re.compile(pattern)
                except re.error as error:
                    raise ValueError(
                        f"LearnerConfig.{name}: {pattern!r} is not a regex: {error}"
                    ) from error
