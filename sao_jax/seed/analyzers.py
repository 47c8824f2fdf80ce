"""Analyzers: a finished episode in, one short hindsight skill out (batched).

A skill states what the episode revealed and the rule that corrects its mistakes. Three kinds:
`RuleBasedAnalyzer` (here: deterministic, an env's `HindsightRules` -- ALFWorld's read the
game's ground truth, the arithmetic env's the task's answer -- writes tagged sentences; labels
stage-1 data on a CPU), `SelfPolicyAnalyzer` (the current policy, `sao_jax.seed.self_analyzer`)
and `OpenAIAnalyzer` (any OpenAI-compatible endpoint, `sao_jax.seed.openai_analyzer`).
"""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Mapping, Sequence

from sao_jax.seed.kinds import (
    HindsightRules,
    SkillPart,
    check_pairs,
    classify,
    fit_parts,
    parts_text,
)
from sao_jax.seed.records import EpisodeRecord
from sao_jax.seed.rules_alfworld import ALFWORLD_RULES


@dataclasses.dataclass(frozen=True)
class Skill:
    """One hindsight skill and where it came from.

    Attributes:
      text: the skill, one or two sentences.
      trajectory_id: the episode it was written about ("" when decoded from a batch).
      success: that episode's outcome.
      task: the episode's task sentence.
      task_type: ALFWorld task type ("" when unknown).
      analyzer: analyzer name ("rule_alfworld", "self_policy", "openai:<model>").
      analyzer_version: its version (rule set, policy version, endpoint model).
      parts: its tagged sentences when a rule-based analyzer wrote it (empty otherwise).
    """

    text: str
    trajectory_id: str
    success: bool
    task: str
    task_type: str
    analyzer: str
    analyzer_version: str
    parts: tuple[SkillPart, ...] = ()

    def kinds(self, patterns: Mapping[str, str] | None = None) -> tuple[str, ...]:
        """What the skill states: its parts' kinds, else its sentences' (`kinds.classify`
        with the env's `patterns`; without patterns an untagged skill is "other")."""
        if self.parts:
            return tuple(dict.fromkeys(p.kind for p in self.parts))
        return classify(self.text, patterns or {})


class Analyzer(abc.ABC):
    """Turns finished episodes into hindsight skills, one per episode, in order."""

    name: str = "analyzer"

    @property
    @abc.abstractmethod
    def version(self) -> str:
        """What produced the current skills (provenance stored with each skill)."""

    @abc.abstractmethod
    def analyze_texts(self, records: Sequence[EpisodeRecord]) -> list[str]:
        """One skill text per record (the batched work of the analyzer)."""

    def analyze_parts(self, records: Sequence[EpisodeRecord]) -> list[tuple[SkillPart, ...]] | None:
        """Tagged sentences per record, for analyzers that write them (None: text only)."""
        return None

    def analyze(self, records: Sequence[EpisodeRecord]) -> list[Skill]:
        """`Skill`s of `records`, in order (an empty list for no records)."""
        records = list(records)
        for record in records:
            if not isinstance(record, EpisodeRecord):
                raise TypeError(f"{self.name}: expected EpisodeRecord, got {type(record).__name__}")
        if not records:
            return []
        parts = self.analyze_parts(records)
        texts = self.analyze_texts(records) if parts is None else [parts_text(p) for p in parts]
        if len(texts) != len(records):
            raise RuntimeError(f"{self.name}: {len(texts)} skills for {len(records)} episodes")
        parts = parts or [()] * len(records)
        version = self.version
        return [
            Skill(t, r.trajectory_id, r.success, r.task, r.task_type, self.name, version, p)
            for t, r, p in zip(texts, records, parts, strict=True)
        ]


class RuleBasedAnalyzer(Analyzer):
    """Skills from an env's `HindsightRules`: tagged sentences (fact, failed_command,
    procedure) about each episode, deterministic. Named `rule_<env>`.

    With `max_tokens` (counted by `tokenizer`) a skill keeps the rules' most important
    sentences that fit (`kinds.fit_parts`): the skill block of re-scored rows has a fixed
    budget, and a truncated block would cut a sentence in half.

    An episode whose game spec names another env is refused; an episode the rules cannot
    read (ALFWorld: no game spec) raises a ValueError naming it.
    """

    def __init__(self, rules: HindsightRules, *, tokenizer=None, max_tokens: int | None = None):
        if max_tokens is not None and tokenizer is None:
            raise ValueError(f"rule_{rules.env}: max_tokens needs the tokenizer that counts them")
        self.rules, self.tokenizer, self.max_tokens = rules, tokenizer, max_tokens
        self.name = f"rule_{rules.env}"

    @property
    def version(self) -> str:
        return self.rules.version

    @property
    def kind_patterns(self) -> Mapping[str, str]:
        return self.rules.kind_patterns

    def analyze_texts(self, records: Sequence[EpisodeRecord]) -> list[str]:
        return [parts_text(p) for p in self.analyze_parts(records)]

    def analyze_parts(self, records: Sequence[EpisodeRecord]) -> list[tuple[SkillPart, ...]]:
        return [self.parts(record) for record in records]

    def parts(self, record: EpisodeRecord) -> tuple[SkillPart, ...]:
        """The tagged sentences about one episode."""
        where = f"{self.name}: episode {record.trajectory_id!r}"
        env = (record.game or {}).get("env", "alfworld")
        if record.game and env != self.rules.env:
            raise ValueError(
                f"{where} is of env {env!r}; this analyzer reads {self.rules.env} episodes "
                "only (use the env's rule analyzer, self_policy or openai)"
            )
        try:
            pairs = self.rules.hindsight(record.game, record.task, record.actions, record.success)
        except ValueError as error:
            raise ValueError(f"{where}: {error}") from error
        parts = check_pairs(pairs, where)
        count = (lambda text: len(self.tokenizer.encode(text))) if self.tokenizer else len
        return fit_parts(parts, count, self.max_tokens)


class RuleBasedAlfworldAnalyzer(RuleBasedAnalyzer):
    """`RuleBasedAnalyzer` of ALFWorld (`sao_jax.seed.rules_alfworld`): where the task's
    objects were, which commands failed and why, the expert's procedure. Needs `record.game`
    (the `header.task` of a rollout, demo or served trajectory)."""

    def __init__(self, *, tokenizer=None, max_tokens: int | None = None):
        super().__init__(ALFWORLD_RULES, tokenizer=tokenizer, max_tokens=max_tokens)
