"""The choice rule: which gated candidate ships, if any.

The failure modes that dominate a window (`Analysis.dominant`: at least `min_count` failures
and `min_share` of all failures) say which surfaces may fix them:

| failure mode | surfaces | why |
|---|---|---|
| `task` (one task keeps failing) | memory | a fact about that task is missing |
| `final_state:step_limit` (episodes run out of steps) | memory, skill | the agent wanders: it lacks where-to-go facts or a procedure |
| `task_type` (one kind of task fails) | skill | a narrow procedural lesson |
| `format` (replies the env cannot parse) | harness | reply-format wording |
| `refused_action` (the env refuses commands) | harness | guardrail wording: what is admissible |
| `tool` (a tool's calls fail) | tool_schema, harness | tool routing and argument formats |
| any of the above, widespread | + policy | the same failure across tenants and tasks is not one deployment's context |

A mode is widespread when its failures span at least `min_tenants` tenants and at least two
task types (or three tasks). `choose` then takes, among the candidates that passed the gate
and whose surface a dominant mode names, the cheapest (`COST_RANK`: memory and skill, then
harness and tool schema, then policy); equal cost: the larger lower bound of the gain. No such
candidate: no-op. The decision, with the candidates refused and those that passed off the
table, goes to the decision log.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from serving.control.analysis import Analysis, FailureMode
from serving.control.audit import DecisionLog
from serving.control.gate import GateResult

SURFACE_TABLE: Mapping[str, tuple[str, ...]] = {
    "task": ("memory",),
    "final_state:step_limit": ("memory", "skill"),
    "task_type": ("skill",),
    "format": ("harness",),
    "refused_action": ("harness",),
    "tool": ("tool_schema", "harness"),
}
_SYMPTOMS = ("format", "refused_action", "tool", "error", "final_state")


def widespread(mode: FailureMode, *, min_tenants: int = 2) -> bool:
    """The same failure across tenants and tasks (a symptom, not a group of its own)."""
    return (
        mode.kind in _SYMPTOMS
        and len(mode.tenants) >= min_tenants
        and (len(mode.task_types) >= 2 or len(mode.tasks) >= 3)
    )


def surfaces_for(mode: FailureMode, *, min_tenants: int = 2) -> tuple[str, ...]:
    """The surfaces that may fix `mode` (the table above)."""
    surfaces = SURFACE_TABLE.get(mode.id, SURFACE_TABLE.get(mode.kind, ()))
    if widespread(mode, min_tenants=min_tenants):
        surfaces = (*surfaces, "policy")
    return surfaces


def recommend(
    analysis: Analysis, *, min_share: float = 0.25, min_count: int = 2, min_tenants: int = 2
) -> dict[str, list[str]]:
    """surface -> the dominant failure modes (ids) that name it."""
    out: dict[str, list[str]] = {}
    for mode in analysis.dominant(min_share=min_share, min_count=min_count):
        for surface in surfaces_for(mode, min_tenants=min_tenants):
            out.setdefault(surface, []).append(mode.id)
    return out


@dataclasses.dataclass(frozen=True)
class Decision:
    """What a round does: `action` "promote" (`chosen` names the gate result) or "noop".

    recommended: surface -> dominant modes; passed / refused / inconclusive: candidate ids by
    verdict; off_table: candidates that passed on a surface no dominant mode names.
    """

    action: str
    chosen: GateResult | None
    recommended: Mapping[str, Sequence[str]]
    passed: tuple[str, ...]
    refused: tuple[str, ...]
    inconclusive: tuple[str, ...]
    off_table: tuple[str, ...]
    reason: str

    @property
    def surface(self) -> str:
        return self.chosen.candidate.surface if self.chosen else "noop"

    def to_json(self) -> dict[str, Any]:
        return {
            "action": self.action,
            "surface": self.surface,
            "chosen": None if self.chosen is None else self.chosen.candidate.id,
            "recommended": {k: list(v) for k, v in self.recommended.items()},
            "passed": list(self.passed),
            "refused": list(self.refused),
            "inconclusive": list(self.inconclusive),
            "off_table": list(self.off_table),
            "reason": self.reason,
        }


def choose(
    analysis: Analysis,
    results: Sequence[GateResult],
    *,
    tenant: str,
    min_share: float = 0.25,
    min_count: int = 2,
    min_tenants: int = 2,
    audit: DecisionLog | None = None,
) -> Decision:
    """The cheapest passed candidate whose surface the window's dominant modes name (module
    docstring), or no-op."""
    recommended = recommend(
        analysis, min_share=min_share, min_count=min_count, min_tenants=min_tenants
    )
    real = [r for r in results if r.candidate.surface != "noop"]
    passed = [r for r in real if r.passed]
    eligible = [r for r in passed if r.candidate.surface in recommended]
    eligible.sort(
        key=lambda r: (r.candidate.cost_rank, -(r.gain.low if r.gain else 0.0), r.candidate.id)
    )
    chosen = eligible[0] if eligible else None
    if chosen is not None:
        modes = recommended[chosen.candidate.surface]
        reason = (
            f"{chosen.candidate.surface} is the cheapest surface that passed the gate for "
            f"{', '.join(modes)}"
        )
    elif not recommended:
        reason = "no dominant failure mode in the window"
    elif not passed:
        reason = "no candidate passed the gate"
    else:
        reason = f"no passed candidate is on a recommended surface ({sorted(recommended)})"
    decision = Decision(
        action="promote" if chosen is not None else "noop",
        chosen=chosen,
        recommended=recommended,
        passed=tuple(r.candidate.id for r in passed),
        refused=tuple(r.candidate.id for r in real if r.verdict == "refuse"),
        inconclusive=tuple(r.candidate.id for r in real if r.verdict == "inconclusive"),
        off_table=tuple(r.candidate.id for r in passed if r.candidate.surface not in recommended),
        reason=reason,
    )
    if audit is not None:
        audit.record("decision", tenant, **decision.to_json())
    return decision
