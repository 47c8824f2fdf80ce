"""SEED: hindsight skills, skill SFT (stage 1) and self-evolving on-policy distillation (stage 2).

See docs/seed.md. Stage 2 is switched on by `LearnerConfig.algorithm = "sao_seed" | "grpo_seed"`
with a `SeedLearner`.
"""

from sao_jax.seed.analyzers import Analyzer, RuleBasedAlfworldAnalyzer, Skill
from sao_jax.seed.bank import (
    SKILLS_TENANT,
    StoredSkill,
    load_skills,
    memory_block,
    skill_trajectory,
    with_skill_memory,
    write_skills,
)
from sao_jax.seed.config import ANALYZERS, SeedConfig, make_analyzer
from sao_jax.seed.opd import SeedLearner
from sao_jax.seed.records import EpisodeRecord, from_batch, from_trajectory
from sao_jax.seed.rescore import skill_injected_batch, skill_logprobs
from sao_jax.seed.self_analyzer import SelfPolicyAnalyzer
from sao_jax.seed.sft import episode_records, label_and_store
from sao_jax.seed.templates import (
    SKILL_BLOCK_TITLE,
    analysis_prompt_ids,
    analysis_text,
    skill_block_ids,
    skill_block_text,
)

__all__ = [
    "ANALYZERS",
    "SKILLS_TENANT",
    "SKILL_BLOCK_TITLE",
    "Analyzer",
    "EpisodeRecord",
    "RuleBasedAlfworldAnalyzer",
    "SeedConfig",
    "SeedLearner",
    "SelfPolicyAnalyzer",
    "Skill",
    "StoredSkill",
    "analysis_prompt_ids",
    "analysis_text",
    "episode_records",
    "from_batch",
    "from_trajectory",
    "label_and_store",
    "load_skills",
    "make_analyzer",
    "memory_block",
    "skill_block_ids",
    "skill_block_text",
    "skill_injected_batch",
    "skill_logprobs",
    "skill_trajectory",
    "with_skill_memory",
    "write_skills",
]
