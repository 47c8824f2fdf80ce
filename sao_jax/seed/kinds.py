"""Skill kinds: what each sentence of a hindsight skill states, and how to tell them apart.

A rule-based analyzer writes a skill as tagged parts (`SkillPart`): a *fact* the episode
revealed ("The mug 1 is in cabinet 3."), a *failed_command* rule ("Nothing happens for 'take
mug 1 from countertop 1': go to countertop 1 first."), the *procedure* that solves the task.
Skills written by a model (the self-policy or an endpoint) carry no tags; `classify` reads
their kinds from the sentence forms the env's rules use (`HindsightRules.kind_patterns`), and
a skill none of whose sentences has a known form is "other" (the word salad of an untrained
analyzer). The learner reports the teacher-student gap per kind (`policy/opd_gap_<kind>`)
from each row's bitmask (`kind_bits`).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Protocol

from sao_jax.losses.seed import SKILL_KINDS

PART_KINDS = SKILL_KINDS[:3]  # what a rule writes; "other" only ever comes from `classify`
OTHER = SKILL_KINDS[3]
_SENTENCE_END = re.compile(r"(?<=[.?!])\s+")


@dataclasses.dataclass(frozen=True)
class SkillPart:
    """One sentence of a skill and its kind (`PART_KINDS`)."""

    kind: str
    text: str

    def __post_init__(self):
        if self.kind not in PART_KINDS:
            raise ValueError(f"SkillPart: unknown kind {self.kind!r}; known: {PART_KINDS}")
        if not self.text.strip():
            raise ValueError(f"SkillPart: empty {self.kind} sentence")


class HindsightRules(Protocol):
    """An env's rule-based hindsight (`sao_jax.seed.rules_alfworld.ALFWORLD_RULES`,
    `sao_jax.envs.arithmetic.hindsight.ARITHMETIC_RULES`): plain data in, tagged sentences
    out, with no import of `sao_jax.seed` (an env package must not depend on it)."""

    env: str
    version: str
    kind_patterns: Mapping[str, str]  # kind -> regex a sentence of that kind starts with

    def hindsight(
        self, spec: Mapping | None, task: str, actions: Sequence[str], success: bool
    ) -> list[tuple[str, str]]:
        """(kind, sentence) pairs about one finished episode, most important first (a skill
        over its budget drops the last ones; `fit_parts`)."""

    def action_labels(self, spec: Mapping | None, task: str, actions: Sequence[str]) -> list[bool]:
        """Per action: whether it was what the env's expert would do there (or won)."""


def parts_text(parts: Iterable[SkillPart]) -> str:
    """The skill text of `parts`: their sentences joined by single spaces."""
    return " ".join(p.text.strip() for p in parts)


def classify(text: str, patterns: Mapping[str, str]) -> tuple[str, ...]:
    """The kinds of `text`'s sentences (in `SKILL_KINDS` order); ("other",) when none of its
    sentences starts with a form of `patterns` (kind -> regex)."""
    compiled = {kind: re.compile(p) for kind, p in patterns.items()}
    unknown = set(compiled) - set(PART_KINDS)
    if unknown:
        raise ValueError(f"classify: unknown kinds {sorted(unknown)}; known: {PART_KINDS}")
    found = set()
    for sentence in _SENTENCE_END.split(text.strip()):
        found |= {kind for kind, regex in compiled.items() if regex.match(sentence)}
    return tuple(k for k in SKILL_KINDS if k in found) or (OTHER,)


def kind_bits(kinds: Iterable[str]) -> int:
    """The bitmask of `kinds` (bit k: `SKILL_KINDS[k]`), as the learner's `skill_kinds`."""
    bits = 0
    for kind in kinds:
        if kind not in SKILL_KINDS:
            raise ValueError(f"kind_bits: unknown kind {kind!r}; known: {SKILL_KINDS}")
        bits |= 1 << SKILL_KINDS.index(kind)
    return bits


def check_pairs(pairs: Sequence[tuple[str, str]], where: str) -> tuple[SkillPart, ...]:
    """`SkillPart`s of a rule set's (kind, sentence) pairs (a clear error for a bad kind)."""
    try:
        return tuple(SkillPart(kind, text) for kind, text in pairs)
    except ValueError as error:
        raise ValueError(f"{where}: {error}") from error


def fit_parts(
    parts: Sequence[SkillPart], length: Callable[[str], int], budget: int | None
) -> tuple[SkillPart, ...]:
    """The parts (given most important first) that fit `budget` tokens together, shown in
    `PART_KINDS` order (facts, failed commands, procedure; stable within a kind).

    `length` counts a text's tokens; parts are taken in order while the joined text fits, a
    part that would not fit is left out (a later, shorter one may still fit). None: all.
    """
    if budget is not None and budget < 1:
        raise ValueError(f"fit_parts: budget must be >= 1 token, got {budget}")
    kept: list[SkillPart] = []
    for part in parts:
        if budget is None or length(parts_text([*kept, part])) <= budget:
            kept.append(part)
    return tuple(sorted(kept, key=lambda p: PART_KINDS.index(p.kind)))
