"""Typed learner configuration: optimizers, trainable-parameter patterns, and one nested config
per algorithm family, so an override names what it tunes (`learner.dis.eps_low=0.2`,
`learner.critic.steps=4`, `learner.policy_optimizer.learning_rate=3e-5`).

Plain dataclasses, so an experiment can nest them in its own config and override any field
from the command line. Defaults that a loss function also has come from that function's module
(`sao_jax.losses`), so each is defined once.
"""

from __future__ import annotations

import dataclasses
import re

from sao_jax.losses.gae import ADAPTIVE_LAMBDA_ALPHA
from sao_jax.losses.kl import KL_KINDS
from sao_jax.losses.ppo import CLIP_EPS_HIGH, CLIP_EPS_LOW
from sao_jax.losses.sao import DIS_EPS_HIGH, DIS_EPS_LOW
from sao_jax.losses.seed import OPD_BETA, OPD_MODES
from sao_jax.models.config import MoeAuxConfig
from sao_jax.models.logprobs import LOGPROB_CHUNK
from sao_jax.train.algorithms import get_algorithm

# Paths are "/"-joined nnx paths: `embed/embedding`, `layers/0/attn/q_proj/kernel`,
# `layers/0/moe/experts/gate_proj`, `layers/1/mlp/up_proj/kernel`, `value_head/kernel`.
ALL_PARAMETERS: tuple[str, ...] = (".*",)
# Packed row counts are this multiple times 1, 2, 3, 4, 6, 8, ... (`packing.bucket_rows`).
PACK_ROW_MULTIPLE = 8
# The KL estimators a penalty can optimise (`KlConfig.kind`): k1's gradient is 0 in expectation.
KL_PENALTY_KINDS = tuple(kind for kind in KL_KINDS if kind != "k1")
# SAO's critic: attention (and embeddings / norms) frozen, MoE / MLP projections + head train.
CRITIC_FFN_AND_HEAD: tuple[str, ...] = (r"(^|/)(moe|mlp)/", r"^value_head/")


@dataclasses.dataclass
class OptimizerConfig:
    """AdamW with linear warm-up and global-norm gradient clipping.

    Attributes:
      learning_rate: peak learning rate (0 freezes the parameters: a control run that plays
        and steps like a learning one without changing its weights).
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
        if not self.learning_rate >= 0:  # also refuses NaN
            raise ValueError(f"learning_rate must be >= 0, got {self.learning_rate}")
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


def _check_range(owner: str, name: str, value: float, low: float, high: float) -> None:
    if not low <= value <= high:
        raise ValueError(f"{owner}.{name} must be in [{low}, {high}], got {value}")


@dataclasses.dataclass(frozen=True)
class DisConfig:
    """DIS (SAO, GRPO+DIS): a token whose rollout ratio r leaves (1 - eps_low, 1 + eps_high)
    gets no gradient (`sao_jax.losses.sao_policy_loss`).

    Attributes:
      eps_low: lower bound: tokens with r <= 1 - eps_low are masked.
      eps_high: upper bound: tokens with r >= 1 + eps_high are masked.
    """

    eps_low: float = DIS_EPS_LOW
    eps_high: float = DIS_EPS_HIGH

    def __post_init__(self):
        if not (0 <= self.eps_low <= 1 and self.eps_high >= 0):
            raise ValueError(
                f"DisConfig: need 0 <= eps_low <= 1 and eps_high >= 0, got {self.eps_low}, "
                f"{self.eps_high}"
            )


@dataclasses.dataclass(frozen=True)
class ClipConfig:
    """The clipped surrogate (PPO, GRPO; `sao_jax.losses.ppo_clip_loss`).

    Attributes:
      eps_low: lower clip range: the ratio is clipped at 1 - eps_low.
      eps_high: upper clip range: the ratio is clipped at 1 + eps_high.
      ppo_epochs: policy steps per batch of an algorithm whose ratio is against the learner's
        own policy at the start of the iteration (PPO: one step would never clip).
    """

    eps_low: float = CLIP_EPS_LOW
    eps_high: float = CLIP_EPS_HIGH
    ppo_epochs: int = 2

    def __post_init__(self):
        if not (0 <= self.eps_low <= 1 and self.eps_high >= 0):
            raise ValueError(
                f"ClipConfig: need 0 <= eps_low <= 1 and eps_high >= 0, got {self.eps_low}, "
                f"{self.eps_high}"
            )
        if self.ppo_epochs < 1:
            raise ValueError(f"ClipConfig.ppo_epochs must be >= 1, got {self.ppo_epochs}")


@dataclasses.dataclass(frozen=True)
class GaeConfig:
    """Action-only GAE of the critic-based algorithms (SAO, PPO; `sao_jax.losses.linked_gae`).

    Attributes:
      gamma: discount per action token.
      lam_alpha: length-adaptive policy lambda = clip(1 - 1 / (lam_alpha * L), 0, 1), L the
        trajectory's action tokens.
      policy_lam: a fixed policy lambda instead of the adaptive one (None: adaptive).
      normalize_advantages: whiten the advantages over the batch's action tokens.
    """

    gamma: float = 1.0
    lam_alpha: float = ADAPTIVE_LAMBDA_ALPHA
    policy_lam: float | None = None
    normalize_advantages: bool = False

    def __post_init__(self):
        _check_range("GaeConfig", "gamma", self.gamma, 0.0, 1.0)
        if self.policy_lam is not None:
            _check_range("GaeConfig", "policy_lam", self.policy_lam, 0.0, 1.0)
        if not self.lam_alpha > 0:
            raise ValueError(f"GaeConfig.lam_alpha must be > 0, got {self.lam_alpha}")


@dataclasses.dataclass(frozen=True)
class CriticConfig:
    """How the critic trains (algorithms with `Algorithm.uses_critic`).

    Attributes:
      steps: critic gradient steps per policy step (K; SAO: 2).
      warmup_steps: critic-only iterations before the first policy step.
      lam: lambda of the critic's targets (1: Monte-Carlo returns).
      value_clip: PPO-style value clipping range of the critic loss (None: off).
    """

    steps: int = 2
    warmup_steps: int = 10
    lam: float = 1.0
    value_clip: float | None = None

    def __post_init__(self):
        if self.steps < 1:
            raise ValueError(f"CriticConfig.steps must be >= 1, got {self.steps}")
        if self.warmup_steps < 0:
            raise ValueError(f"CriticConfig.warmup_steps must be >= 0, got {self.warmup_steps}")
        _check_range("CriticConfig", "lam", self.lam, 0.0, 1.0)
        if self.value_clip is not None and self.value_clip <= 0:
            raise ValueError(f"CriticConfig.value_clip must be > 0 or None, got {self.value_clip}")


@dataclasses.dataclass(frozen=True)
class GroupConfig:
    """GRPO's group-relative advantages (`sao_jax.losses.group_advantages`).

    Attributes:
      size: rollouts per prompt (G), used to check batches hold whole groups.
      normalize_std: divide by the group's std (False: subtract the mean only).
    """

    size: int = 4
    normalize_std: bool = True

    def __post_init__(self):
        if self.size < 1:
            raise ValueError(f"GroupConfig.size must be >= 1, got {self.size}")


@dataclasses.dataclass(frozen=True)
class OpdConfig:
    """SEED's on-policy distillation term (algorithms with `Algorithm.opd`;
    `sao_jax.losses.seed_opd_loss`).

    Attributes:
      weight: the term's weight in the policy loss (lambda in SEED).
      beta: gate sharpness of the gated form.
      mode: on the sampled tokens, "gated" (never lowers a sampled token's probability) or
        "signed" (OPID); or "kl": the forward KL from the teacher's whole next-token
        distribution (its `top_k` most likely tokens and the rest) at every action token
        (`sao_jax.losses.seed_distribution_loss`): it also moves probability towards tokens the
        policy did not sample. The re-scoring forward then also keeps the teacher's top k.
      clip: bound on |skill_logp - logp| of the signed form (None: unbounded).
      top_k: the teacher's tokens kept per action token in mode "kl" (the rest is one bucket).
      grad_share: diagnostics: also measure the term's share of the policy gradient in
        parameter space (`policy/opd_grad_share`: |grad of weight * L_opd| / |grad of the
        whole policy loss|), at the cost of one more forward and backward pass per policy
        step; the cheap estimate `policy/opd_token_grad_share` is always reported.
    """

    weight: float = 0.01
    beta: float = OPD_BETA
    mode: str = OPD_MODES[0]
    clip: float | None = None
    top_k: int = 16
    grad_share: bool = False

    def __post_init__(self):
        if self.weight < 0 or self.beta < 0:
            raise ValueError(
                f"OpdConfig.weight / beta must be >= 0, got {self.weight} / {self.beta}"
            )
        if self.mode not in OPD_MODES:
            raise ValueError(f"OpdConfig.mode must be one of {OPD_MODES}, got {self.mode!r}")
        if self.clip is not None and (self.mode != "signed" or self.clip <= 0):
            raise ValueError("OpdConfig.clip must be > 0 and needs mode='signed'")
        if self.top_k < 1:
            raise ValueError(f"OpdConfig.top_k must be >= 1, got {self.top_k}")


@dataclasses.dataclass(frozen=True)
class KlConfig:
    """A KL(pi || reference) penalty on the policy's action tokens (`sao_jax.losses.kl_estimate`),
    the reference being the policy the learner started from (a warm start, a pretrained
    checkpoint): it holds RL near what it started from instead of drifting with every batch.

    Attributes:
      coef: the penalty's weight in the policy loss (beta; 0: no penalty).
      kind: the estimator the penalty optimises: "k3" (GRPO's choice: unbiased, >= 0, low
        variance) or "k2" (its gradient is the reverse KL's, in expectation over the policy's
        samples). Not "k1": on the policy's own samples its gradient is 0 in expectation, and
        on a fixed batch it only lowers the sampled tokens' probabilities, which moves the
        policy away. All three are logged either way (`policy/kl_k1`, ...).
      track: with coef 0, still keep the reference and log the three estimators: how far the
        policy has moved from where it started, at the cost of one reference forward pass per
        iteration.
    """

    coef: float = 0.0
    kind: str = "k3"
    track: bool = False

    def __post_init__(self):
        if not self.coef >= 0:
            raise ValueError(f"KlConfig.coef must be >= 0, got {self.coef}")
        if self.kind not in KL_PENALTY_KINDS:
            raise ValueError(
                f"KlConfig.kind must be one of {KL_PENALTY_KINDS}, got {self.kind!r} (k1 is "
                "logged, not a penalty: its gradient is 0 in expectation)"
            )

    @property
    def active(self) -> bool:
        """Whether the learner keeps a reference policy (a penalty, or tracking)."""
        return self.coef > 0 or self.track


@dataclasses.dataclass
class LearnerConfig:
    """What the learner optimises and how.

    Attributes:
      algorithm: "sao", "grpo", "grpo_dis", "ppo", "sao_seed", "grpo_seed" (see
        sao_jax.train.algorithms.ALGORITHMS); its record says which nested config below it
        reads (`Algorithm.ratio_bounds`: dis or clip; `uses_critic`: gae, critic;
        `advantage="group"`: group; `opd`: opd).
      policy_optimizer: optimizer of the policy's trainable parameters.
      critic_optimizer: optimizer of the critic's trainable parameters.
      policy_trainable: regexes (searched in "/"-joined nnx paths) of policy parameters that
        train; the rest stay frozen.
      critic_trainable: regexes of critic parameters that train (SAO: MoE / MLP and value head).
      dis: DIS ratio bounds (SAO, GRPO+DIS).
      clip: clipped-surrogate range and PPO's epochs (PPO, GRPO).
      gae: discount and lambdas of the GAE advantages (SAO, PPO).
      critic: critic steps, warm-up, target lambda, value clipping (SAO, PPO).
      group: GRPO's group size and normalisation.
      opd: SEED's distillation term (sao_seed, grpo_seed).
      kl: a KL penalty towards the starting policy (any algorithm; off by default).
      moe: weights of the MoE auxiliary losses (policy and critic).
      entropy_coef: weight of an entropy bonus on the policy (0: none).
      reset_optimizer_on_sync: re-initialise the policy optimizer state whenever weights are
        published to the rollout workers.
      logprob_chunk_size: sequence chunk of the log-prob computation (memory of [B, chunk, V]).
      head_positions: where the RL steps run the LM head and the value head: "actions" (only
        at the action tokens, the only positions the losses read, listed per block of rows a
        device holds, so nearly every head position is an action token), "rows" (at the action
        tokens in a [rows, K] layout: K per row, the fullest row's count; padding wherever rows
        hold fewer) or "all" (every position, the reference path). The same results either way.
      max_action_tokens_per_row: with head_positions="rows", the static per-row capacity K
        of gathered action tokens (a batch with a fuller row is refused); None: K follows each
        batch (its fullest row, bucketed; a few compiled shapes).
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
    dis: DisConfig = dataclasses.field(default_factory=DisConfig)
    clip: ClipConfig = dataclasses.field(default_factory=ClipConfig)
    gae: GaeConfig = dataclasses.field(default_factory=GaeConfig)
    critic: CriticConfig = dataclasses.field(default_factory=CriticConfig)
    group: GroupConfig = dataclasses.field(default_factory=GroupConfig)
    opd: OpdConfig = dataclasses.field(default_factory=OpdConfig)
    kl: KlConfig = dataclasses.field(default_factory=KlConfig)
    moe: MoeAuxConfig = dataclasses.field(default_factory=MoeAuxConfig)
    entropy_coef: float = 0.0
    reset_optimizer_on_sync: bool = False
    logprob_chunk_size: int = LOGPROB_CHUNK
    head_positions: str = "actions"
    max_action_tokens_per_row: int | None = None
    pack_rows: bool = True
    pack_row_multiple: int = PACK_ROW_MULTIPLE
    fused_iteration: bool = True

    def __post_init__(self):
        get_algorithm(self.algorithm)
        for name in ("logprob_chunk_size", "pack_row_multiple"):
            if getattr(self, name) < 1:
                raise ValueError(f"LearnerConfig.{name} must be >= 1, got {getattr(self, name)}")
        if self.head_positions not in ("actions", "rows", "all"):
            raise ValueError(
                f"LearnerConfig.head_positions must be 'actions', 'rows' or 'all', got "
                f"{self.head_positions!r}"
            )
        if self.max_action_tokens_per_row is not None and self.max_action_tokens_per_row < 1:
            raise ValueError(
                "LearnerConfig.max_action_tokens_per_row must be >= 1 or None, got "
                f"{self.max_action_tokens_per_row}"
            )
        for name in ("policy_trainable", "critic_trainable"):
            for pattern in getattr(self, name):
                try:
                    re.compile(pattern)
                except re.error as error:
                    raise ValueError(
                        f"LearnerConfig.{name}: {pattern!r} is not a regex: {error}"
                    ) from error
