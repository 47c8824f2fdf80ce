"""SEED's knobs for an experiment, and analyzers by name."""

from __future__ import annotations

import dataclasses

from sao_jax.envs.arithmetic.hindsight import ARITHMETIC_RULES
from sao_jax.seed.analyzers import Analyzer, RuleBasedAlfworldAnalyzer, RuleBasedAnalyzer
from sao_jax.seed.kinds import HindsightRules
from sao_jax.seed.rules_alfworld import ALFWORLD_RULES
from sao_jax.seed.templates import skill_block_ids

# "rule": the rule-based analyzer of the run's env; "rule_<env>": that env's
ANALYZERS = ("rule", "rule_alfworld", "rule_arithmetic", "self_policy", "openai")
HINDSIGHT_RULES: dict[str, HindsightRules] = {
    rules.env: rules for rules in (ALFWORLD_RULES, ARITHMETIC_RULES)
}


def hindsight_rules(env: str) -> HindsightRules | None:
    """The rule-based hindsight of env `env` (None: the env has none)."""
    return HINDSIGHT_RULES.get(env)


@dataclasses.dataclass
class SeedConfig:
    """SEED stages 1 and 2 (the OPD weights themselves are `LearnerConfig.opd_*`).

    Attributes:
      sft_analyzer: analyzer labelling stage-1 data: "rule" (the env's rules: CPU, ground
        truth; or "rule_alfworld" / "rule_arithmetic"), "openai" (an endpoint) or "self_policy".
      sft_episodes: episodes of the warm-started policy played and labelled for stage 1.
      sft_steps: joint acting + analysing fine-tuning steps (0: no stage 1).
      sft_learning_rate: learning rate of stage 1 (3e-5: at 1e-3 stage 1 cost the tiny
        preset's cloned policy 34 unseen points before any RL step, at 1e-4 11, at 3e-5 4).
      sft_acting: also fine-tune on acting data in stage 1 (won episodes as played, lost ones
        relabelled by the expert); False trains on the skills (analysing) only.
      sft_skill_acting: also fine-tune on acting turns with the episode's skill block in
        context (`skill_acting`): every played episode relabelled by `sft_skill_expert`, each
        prompt prefixed with its skill's block as stage 2 injects it, so the policy learns to
        read a skill; the loader's rows grow by `max_skill_tokens`.
      sft_skill_expert: the expert that labels those turns: one that acts on what the skill
        states ("oracle": ALFWorld's planner, whose procedure and object locations the
        rule-based skill states).
      warm_start_skill_fraction: the share of the warm start's expert demos that are also
        cloned as acting turns with a skill in context, from the first cloning step: the
        env's rule-based analyzer writes the demo's skill, `sft_skill_expert` relabels its
        turns, each prompt carries the skill's block (as `sft_skill_acting` does in stage 1,
        but over thousands of rows instead of a few hundred); cloning rows grow by
        `max_skill_tokens` and the epochs count these turns too (0: off).
      opd_analyzer: stage-2 analyzer: "self_policy" (SEED) or "rule" / "openai".
      max_skill_tokens: skill-block budget of re-scored rows (S); a rule-based skill keeps
        its most important sentences that fit it (the ALFWorld rules' skills take 30-150
        word tokens, a block's title and instruction about 20 more).
      max_skill_new_tokens: tokens a generated skill may take (room for a skill in the rule
        sentence forms stage 1 teaches).
      skill_temperature: sampling temperature of the self-policy analyzer.
      max_actions: actions of an episode the analysis prompt shows.
      openai_url: base URL of the OpenAI-compatible endpoint (analyzer "openai").
      openai_model: its model name.
      store_skills: write stage-2 skills to the `skills` tenant (the skill bank).
      eval_after_sft: evaluate the policy greedily right after stage 1, as the start and end
        evaluations do (summary `unseen_success_after_sft`, ...): what stage 1 alone did to
        acting, before any RL step.
    """

    sft_analyzer: str = "rule"
    sft_episodes: int = 64
    sft_steps: int = 60
    sft_learning_rate: float = 3e-5
    sft_acting: bool = True
    sft_skill_acting: bool = False
    sft_skill_expert: str = "oracle"
    warm_start_skill_fraction: float = 0.0
    opd_analyzer: str = "self_policy"
    max_skill_tokens: int = 128
    max_skill_new_tokens: int = 96
    skill_temperature: float = 1.0
    max_actions: int = 12
    openai_url: str = ""
    openai_model: str = ""
    store_skills: bool = True
    eval_after_sft: bool = True

    def __post_init__(self):
        for name in ("sft_analyzer", "opd_analyzer"):
            if getattr(self, name) not in ANALYZERS:
                raise ValueError(
                    f"SeedConfig.{name}: unknown analyzer {getattr(self, name)!r}; known: "
                    f"{ANALYZERS}"
                )
        for name in ("sft_episodes", "max_skill_new_tokens", "max_actions"):
            if getattr(self, name) < 1:
                raise ValueError(f"SeedConfig.{name} must be >= 1, got {getattr(self, name)}")
        if not 0.0 <= self.warm_start_skill_fraction <= 1.0:
            raise ValueError(
                "SeedConfig.warm_start_skill_fraction must be in [0, 1], got "
                f"{self.warm_start_skill_fraction}"
            )
        if self.sft_steps < 0:
            raise ValueError(f"SeedConfig.sft_steps must be >= 0, got {self.sft_steps}")
        if self.max_skill_tokens < 4:
            raise ValueError(
                f"SeedConfig.max_skill_tokens must be >= 4, got {self.max_skill_tokens}"
            )


def make_analyzer(
    name: str, *, config: SeedConfig, sampler=None, tokenizer=None, env: str = "alfworld"
) -> Analyzer:
    """The analyzer `name` ("rule": env `env`'s rules, "rule_<env>", "self_policy" with
    `sampler` + `tokenizer`, or "openai" with `config.openai_url` / `openai_model`). A
    rule-based one given the `tokenizer` keeps each skill within `config.max_skill_tokens`
    with its block."""
    if name.startswith("rule"):
        rules_env = env if name == "rule" else name.removeprefix("rule_")
        rules = hindsight_rules(rules_env)
        if name not in ANALYZERS or rules is None:
            raise ValueError(
                f"analyzer {name!r}: env {rules_env!r} has no rule-based hindsight; envs with "
                f"rules: {sorted(HINDSIGHT_RULES)} (use self_policy or openai)"
            )
        budget = {}
        if tokenizer is not None:  # what the block's title, instruction and markers leave
            overhead = len(skill_block_ids(tokenizer, "x")) - len(tokenizer.encode("x"))
            budget = dict(
                tokenizer=tokenizer, max_tokens=max(config.max_skill_tokens - overhead, 1)
            )
        if rules_env == "alfworld":
            return RuleBasedAlfworldAnalyzer(**budget)
        return RuleBasedAnalyzer(rules, **budget)
    if name == "self_policy":
        from sao_jax.seed.self_analyzer import SelfPolicyAnalyzer

        if sampler is None or tokenizer is None:
            raise ValueError("the self_policy analyzer needs the policy's sampler and tokenizer")
        return SelfPolicyAnalyzer(
            sampler,
            tokenizer,
            max_new_tokens=config.max_skill_new_tokens,
            temperature=config.skill_temperature,
            max_actions=config.max_actions,
        )
    if name == "openai":
        from sao_jax.seed.openai_analyzer import OpenAIAnalyzer

        if not config.openai_url or not config.openai_model:
            raise ValueError("the openai analyzer needs seed.openai_url and seed.openai_model")
        return OpenAIAnalyzer(
            config.openai_url, config.openai_model, max_actions=config.max_actions
        )
    raise ValueError(f"unknown analyzer {name!r}; known: {ANALYZERS}")
