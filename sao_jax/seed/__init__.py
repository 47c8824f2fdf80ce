"""SEED: hindsight skills, skill SFT (stage 1) and self-evolving on-policy distillation (stage 2).

See docs/seed.md. Stage 2 is switched on by `LearnerConfig.algorithm = "sao_seed" | "grpo_seed"`
with a `SeedLearner`.
"""

from sao_jax.seed.analyzers import Analyzer, RuleBasedAlfworldAnalyzer, RuleBasedAnalyzer, Skill
from sao_jax.seed.bank import (
    SKILLS_TENANT,
    StoredSkill,
    load_skills,
    memory_block,
    skill_trajectory,
    with_skill_memory,
    write_skills,
)
from sao_jax.seed.config import ANALYZERS, SeedConfig, hindsight_rules, make_analyzer
from sao_jax.seed.kinds import PART_KINDS, SkillPart, classify, kind_bits
from sao_jax.seed.opd import SeedLearner
from sao_jax.seed.records import EpisodeRecord, from_batch, from_trajectory, with_task_specs
from sao_jax.seed.rescore import skill_injected_batch, skill_logprobs, skill_top_logprobs
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
    "PART_KINDS",
    "SKILLS_TENANT",
    "SKILL_BLOCK_TITLE",
    "Analyzer",
    "EpisodeRecord",
    "RuleBasedAlfworldAnalyzer",
    "RuleBasedAnalyzer",
    "SeedConfig",
    "SeedLearner",
    "SelfPolicyAnalyzer",
    "Skill",
    "SkillPart",
    "StoredSkill",
    "analysis_prompt_ids",
    "analysis_text",
    "classify",
    "episode_records",
    "from_batch",
    "from_trajectory",
    "hindsight_rules",
    "kind_bits",
    "label_and_store",
    "load_skills",
    "make_analyzer",
    "memory_block",
    "skill_block_ids",
    "skill_block_text",
    "skill_injected_batch",
    "skill_logprobs",
    "skill_top_logprobs",
    "skill_trajectory",
    "with_skill_memory",
    "with_task_specs",
    "write_skills",
]
