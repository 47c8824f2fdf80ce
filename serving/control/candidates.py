"""Candidate evolution actions: what one would change in a composite, where it came from, and
what it costs.

A `Candidate` is one evolution action on one surface:

| surface | its patch may set | cost rank |
|---|---|---|
| `noop` | nothing | 0 |
| `memory` | memory notes (facts keyed on one task's words) | 1 |
| `skill` | memory notes (a procedural lesson keyed on a task type's words) | 1 |
| `harness` | harness instructions, system prompt / mode, tool descriptions, reply choices | 2 |
| `tool_schema` | tool-schema overrides and tool descriptions | 2 |
| `policy` | the policy reference (new weights) | 3 |

The cost rank orders surfaces from cheapest and safest (a note that only some conversations
retrieve) to the most expensive (new weights for every conversation); the choice rule
(`choice.py`) takes the cheapest candidate that passes the gate. A candidate's patch may only
touch what its surface names, so a surface cannot hide a costlier change.

A `Patch` is JSON content applied on top of any composite (`Patch.apply`): notes are added
(replacing a note with the same id), instructions appended (once), tool descriptions and
schemas set by tool name, the policy replaced. The result is validated as a whole composite
(`CompositeSpec.from_json`), so a patch the store would refuse fails here with the same
`CompositeError`, naming the field, before anything is stored.

`Provenance` says which tenant's trajectories it was learned from (governance decides whether
it may reach another tenant, `deploy.py`), the window, the analyzer or template that wrote
it, the failure modes it addresses and the trajectory ids.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from serving.control.composite import CompositeError, CompositeSpec, fingerprint
from serving.control.store import ControlError

SURFACES = ("noop", "memory", "skill", "harness", "tool_schema", "policy")
COST_RANK: Mapping[str, int] = {
    "noop": 0,
    "memory": 1,
    "skill": 1,
    "harness": 2,
    "tool_schema": 2,
    "policy": 3,
}
# which patch fields each surface may set
_FIELDS: Mapping[str, frozenset[str]] = {
    "noop": frozenset(),
    "memory": frozenset({"notes"}),
    "skill": frozenset({"notes"}),
    "harness": frozenset(
        {"instructions", "system_prompt", "system_mode", "tool_descriptions", "reply_choices"}
    ),
    "tool_schema": frozenset({"tool_schemas", "tool_descriptions"}),
    "policy": frozenset({"policy"}),
}
_PATCH_FIELDS = (
    "notes",
    "instructions",
    "system_prompt",
    "system_mode",
    "tool_descriptions",
    "tool_schemas",
    "reply_choices",
    "policy",
)


class UnknownSurface(ControlError):
    """A candidate on a surface that is not one of `SURFACES`."""


class InvalidCandidate(ControlError):
    """A candidate whose patch does not fit its surface."""


@dataclasses.dataclass(frozen=True)
class Patch:
    """What a candidate changes (JSON content; see the module docstring).

    notes: memory notes (`MemoryNote` JSON) to add; instructions: harness instructions to
    append; system_prompt / system_mode: the harness system prompt and mode to set (None:
    unchanged); tool_descriptions: tool name -> description; tool_schemas: tool name ->
    {"version", "parameters"}; reply_choices: the harness's `ReplyChoices` JSON to set (None:
    unchanged); policy: the `PolicyRef` JSON to serve (None: unchanged).
    """

    notes: tuple[Mapping[str, Any], ...] = ()
    instructions: tuple[str, ...] = ()
    system_prompt: str | None = None
    system_mode: str | None = None
    tool_descriptions: Mapping[str, str] = dataclasses.field(default_factory=dict)
    tool_schemas: Mapping[str, Mapping[str, Any]] = dataclasses.field(default_factory=dict)
    reply_choices: Mapping[str, Any] | None = None
    policy: Mapping[str, Any] | None = None

    def __post_init__(self):
        object.__setattr__(self, "notes", tuple(dict(n) for n in self.notes))
        object.__setattr__(self, "instructions", tuple(self.instructions))

    def fields(self) -> set[str]:
        """The fields this patch sets."""
        out = set()
        for name in _PATCH_FIELDS:
            value = getattr(self, name)
            empty = isinstance(value, tuple | Mapping) and not value
            if value is not None and not empty:  # "" is a value: it clears a system prompt
                out.add(name)
        return out

    def to_json(self) -> dict[str, Any]:
        return {
            "notes": [dict(n) for n in self.notes],
            "instructions": list(self.instructions),
            "system_prompt": self.system_prompt,
            "system_mode": self.system_mode,
            "tool_descriptions": dict(sorted(self.tool_descriptions.items())),
            "tool_schemas": {k: dict(v) for k, v in sorted(self.tool_schemas.items())},
            "policy": None if self.policy is None else dict(self.policy),
            # only when set: earlier candidates keep their ids
            **({} if self.reply_choices is None else {"reply_choices": dict(self.reply_choices)}),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Patch:
        unknown = set(data) - set(_PATCH_FIELDS)
        if unknown:
            raise InvalidCandidate(f"patch: unknown field(s) {sorted(unknown)}")
        return cls(
            notes=tuple(data.get("notes") or ()),
            instructions=tuple(data.get("instructions") or ()),
            system_prompt=data.get("system_prompt"),
            system_mode=data.get("system_mode"),
            tool_descriptions=dict(data.get("tool_descriptions") or {}),
            tool_schemas=dict(data.get("tool_schemas") or {}),
            reply_choices=data.get("reply_choices"),
            policy=data.get("policy"),
        )

    def apply(self, spec: CompositeSpec) -> CompositeSpec:
        """`spec` with this patch applied, validated as a whole (`CompositeError` if not)."""
        data = spec.to_json()
        notes = {n["id"]: n for n in data["memory"]["notes"]}
        for note in self.notes:
            if not isinstance(note, Mapping) or "id" not in note:
                raise CompositeError("patch.notes: every note needs an 'id'")
            notes[note["id"]] = dict(note)
        data["memory"]["notes"] = list(notes.values())
        harness = data["harness"]
        harness["instructions"] += [
            i for i in self.instructions if i not in harness["instructions"]
        ]
        if self.system_prompt is not None:
            harness["system_prompt"] = self.system_prompt
        if self.system_mode is not None:
            harness["system_mode"] = self.system_mode
        harness["tool_descriptions"].update(self.tool_descriptions)
        if self.reply_choices is not None:
            harness["reply_choices"] = dict(self.reply_choices)
        data["tools"]["schemas"].update({k: dict(v) for k, v in self.tool_schemas.items()})
        if self.policy is not None:
            data["policy"] = dict(self.policy)
        return CompositeSpec.from_json(data, "candidate")


@dataclasses.dataclass(frozen=True)
class Provenance:
    """Where a candidate came from.

    tenant: whose trajectories it was learned from; window: the window's description
    (`WindowSpec.to_json`); analyzer: what wrote it ("rule_alfworld:rules-v1",
    "template:reply_format", "train:<name>", ...); modes: the failure mode ids it addresses;
    trajectories: the trajectory ids it was learned from.
    """

    tenant: str
    analyzer: str
    window: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    modes: tuple[str, ...] = ()
    trajectories: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {
            "tenant": self.tenant,
            "analyzer": self.analyzer,
            "window": dict(self.window),
            "modes": list(self.modes),
            "trajectories": list(self.trajectories),
        }


@dataclasses.dataclass(frozen=True)
class Candidate:
    """One evolution action: `patch` on `surface`, learned as `provenance` says.

    id: "<surface>-<8 letters of the patch's fingerprint>" (equal patches, equal ids).
    """

    surface: str
    patch: Patch
    provenance: Provenance
    rationale: str = ""

    def __post_init__(self):
        if self.surface not in SURFACES:
            raise UnknownSurface(
                f"unknown surface {self.surface!r}; a candidate's surface is one of "
                f"{list(SURFACES)}"
            )
        if not isinstance(self.patch, Patch):
            raise InvalidCandidate(f"candidate patch must be a Patch, got {type(self.patch)}")
        extra = self.patch.fields() - _FIELDS[self.surface]
        if extra:
            raise InvalidCandidate(
                f"a {self.surface} candidate may set {sorted(_FIELDS[self.surface]) or 'nothing'}"
                f", not {sorted(extra)}"
            )
        if self.surface != "noop" and not self.patch.fields():
            raise InvalidCandidate(f"a {self.surface} candidate must change something")

    @property
    def id(self) -> str:
        return f"{self.surface}-{fingerprint(self.patch.to_json())[:8]}"

    @property
    def cost_rank(self) -> int:
        return COST_RANK[self.surface]

    def apply_to(self, spec: CompositeSpec) -> CompositeSpec:
        """The composite this candidate would serve on top of `spec`."""
        return self.patch.apply(spec)

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "surface": self.surface,
            "cost_rank": self.cost_rank,
            "patch": self.patch.to_json(),
            "provenance": self.provenance.to_json(),
            "rationale": self.rationale,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Candidate:
        provenance = data.get("provenance") or {}
        return cls(
            surface=data.get("surface", ""),
            patch=Patch.from_json(data.get("patch") or {}),
            provenance=Provenance(
                tenant=provenance.get("tenant", ""),
                analyzer=provenance.get("analyzer", ""),
                window=provenance.get("window") or {},
                modes=tuple(provenance.get("modes") or ()),
                trajectories=tuple(provenance.get("trajectories") or ()),
            ),
            rationale=data.get("rationale", ""),
        )


def noop(tenant: str, window: Mapping[str, Any] | None = None) -> Candidate:
    """The no-op: keep the current composite (the baseline every candidate is compared to)."""
    return Candidate(
        "noop", Patch(), Provenance(tenant, "noop", window or {}), "keep the current composite"
    )
