"""The RL algorithms one learner runs, by name: what each needs and how it forms its update.

An algorithm is a policy objective (from `sao_jax.losses.get_policy_loss`) with the ratio
bounds it reads from the learner's config, an advantage estimator, the log-probs its ratio is
taken against, and whether it trains a critic. Adding one
(e.g. a SEED variant) is a `register_algorithm` call; the learner and the comparison experiment
pick it up by name.
"""

from __future__ import annotations

import dataclasses
from typing import Literal

from sao_jax.losses import POLICY_LOSS_NAMES

AdvantageKind = Literal["gae", "group"]
BehaviourKind = Literal["rollout", "old_policy"]
RatioBounds = Literal["dis", "clip"]


@dataclasses.dataclass(frozen=True)
class Algorithm:
    """One RL algorithm of the learner.

    Attributes:
      name: config name.
      policy_loss: objective name in `sao_jax.losses.POLICY_LOSS_NAMES`.
      ratio_bounds: which (eps_low, eps_high) of the learner's config the objective gets:
        "dis" (`LearnerConfig.dis`: DIS masks tokens whose rollout ratio leaves
        [1 - eps_low, 1 + eps_high]) or "clip" (`LearnerConfig.clip`: the PPO surrogate's
        clip range).
      advantage: "gae" (critic + action-only GAE) or "group" (GRPO's group-relative rewards).
      behaviour: the ratio's denominator: "rollout" (log-probs recorded by the sampler) or
        "old_policy" (the learner's own log-probs at the start of the iteration, PPO).
      uses_critic: trains a critic (needed by "gae").
      label: human-readable name for tables and plots.
      opd: adds SEED's self-distillation term `opd.weight * seed_opd_loss` to the policy loss;
        batches must then carry `skill_logp` [R, T] (see `sao_jax.seed`).
    """

    name: str
    policy_loss: str
    ratio_bounds: RatioBounds
    advantage: AdvantageKind
    behaviour: BehaviourKind
    uses_critic: bool
    label: str
    opd: bool = False

    def __post_init__(self):
        if self.policy_loss not in POLICY_LOSS_NAMES:
            raise ValueError(
                f"algorithm {self.name!r}: unknown policy loss {self.policy_loss!r}; "
                f"known: {POLICY_LOSS_NAMES}"
            )
        if self.ratio_bounds not in ("dis", "clip"):
            raise ValueError(
                f"algorithm {self.name!r}: ratio_bounds must be 'dis' or 'clip', got "
                f"{self.ratio_bounds!r}"
            )
        if self.advantage not in ("gae", "group"):
            raise ValueError(f"algorithm {self.name!r}: advantage must be 'gae' or 'group'")
        if self.behaviour not in ("rollout", "old_policy"):
            raise ValueError(
                f"algorithm {self.name!r}: behaviour must be 'rollout' or 'old_policy'"
            )
        if self.advantage == "gae" and not self.uses_critic:
            raise ValueError(f"algorithm {self.name!r}: GAE advantages need a critic")


ALGORITHMS: dict[str, Algorithm] = {}


def register_algorithm(algorithm: Algorithm, *, overwrite: bool = False) -> Algorithm:
    """Make `algorithm` selectable by `LearnerConfig.algorithm = algorithm.name`."""
    if algorithm.name in ALGORITHMS and not overwrite:
        raise ValueError(f"algorithm {algorithm.name!r} is already registered")
    ALGORITHMS[algorithm.name] = algorithm
    return algorithm


def get_algorithm(name: str) -> Algorithm:
    """The registered algorithm `name`; ValueError listing the known names otherwise."""
    if name not in ALGORITHMS:
        raise ValueError(f"unknown algorithm {name!r}; known: {sorted(ALGORITHMS)}")
    return ALGORITHMS[name]


register_algorithm(Algorithm("sao", "sao", "dis", "gae", "rollout", True, "SAO"))
register_algorithm(Algorithm("grpo", "grpo", "clip", "group", "rollout", False, "GRPO"))
register_algorithm(Algorithm("grpo_dis", "grpo_dis", "dis", "group", "rollout", False, "GRPO+DIS"))
register_algorithm(Algorithm("ppo", "ppo", "clip", "gae", "old_policy", True, "PPO"))
register_algorithm(
    Algorithm("sao_seed", "sao", "dis", "gae", "rollout", True, "SAO+SEED", opd=True)
)
register_algorithm(
    Algorithm("grpo_seed", "grpo", "clip", "group", "rollout", False, "GRPO+SEED", opd=True)
)
