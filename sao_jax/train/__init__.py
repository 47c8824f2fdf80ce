"""SAO learner and baselines (GRPO, GRPO+DIS, PPO) over ATDP batches; behaviour-cloning warm start.

Data flow: `atdp_io` loader batch -> `Learner.iteration` (critic values -> linked action-only GAE
-> one DIS policy step -> K critic steps) -> `Learner.policy_module()` for weight publication.
"""

from sao_jax.train.advantages import grouped_advantages, prompt_group_ids
from sao_jax.train.algorithms import ALGORITHMS, Algorithm, get_algorithm, register_algorithm
from sao_jax.train.config import (
    ClipConfig,
    CriticConfig,
    DisConfig,
    GaeConfig,
    GroupConfig,
    KlConfig,
    LearnerConfig,
    OpdConfig,
    OptimizerConfig,
)
from sao_jax.train.learner import Learner, LearnerCounters
from sao_jax.train.partition import split_trainable, trainable_filter
from sao_jax.train.steps import make_optimizer
from sao_jax.train.warm_start import BehaviourCloner

__all__ = [
    "ALGORITHMS",
    "Algorithm",
    "BehaviourCloner",
    "ClipConfig",
    "CriticConfig",
    "DisConfig",
    "GaeConfig",
    "GroupConfig",
    "KlConfig",
    "Learner",
    "LearnerConfig",
    "LearnerCounters",
    "OpdConfig",
    "OptimizerConfig",
    "get_algorithm",
    "grouped_advantages",
    "make_optimizer",
    "prompt_group_ids",
    "register_algorithm",
    "split_trainable",
    "trainable_filter",
]
