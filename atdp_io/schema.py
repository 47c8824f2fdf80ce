"""Typed, versioned ATDP records: a trajectory header, its events and late-bound annotations.

An event is the protocol's step `e_t = <o, h, a, y, r, m>`: `observation`, `hidden`, `action`,
`result`, `rewards`, `metadata`, plus the lossless LLM call (`llm`) when the event is one, its
replay class and its redaction status. Every record validates itself on construction and raises
`SchemaError` naming the offending field, so a bad record never reaches storage.

Records are immutable. Signals that arrive later (rewards, tool verdicts, critiques, governance
changes such as a review decision or a consent withdrawal) are separate `Annotation` records that
point at a trajectory (and optionally an event); the original record is never rewritten.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from atdp_io.enums import (
    ActionKind,
    Classification,
    ConsentStatus,
    EventKind,
    LegalBasis,
    RedactionStatus,
    ReplayClass,
    ReviewStatus,
    Verdict,
)
from atdp_io.events import (
    Action,
    DecodingParams,
    Event,
    EventMetadata,
    LLMCall,
    Reward,
    ToolCall,
)
from atdp_io.validation import (
    SchemaError,
    check_enum,
    check_finite,
    check_int,
    check_str,
    check_tenant_id,
    fail,
)

SCHEMA_VERSION = 1
_MAX_ID_CHARS = 256

__all__ = [
    "SCHEMA_VERSION",
    "Action",
    "ActionKind",
    "Annotation",
    "Classification",
    "ConsentStatus",
    "Critique",
    "DecodingParams",
    "Envelope",
    "Event",
    "EventKind",
    "EventMetadata",
    "Governance",
    "GovernanceUpdate",
    "LLMCall",
    "LateReward",
    "LegalBasis",
    "Outcome",
    "RedactionStatus",
    "ReplayClass",
    "ReviewStatus",
    "Reward",
    "SchemaError",
    "SourceRef",
    "ToolCall",
    "Trajectory",
    "TrajectoryHeader",
    "Verdict",
    "VerdictUpdate",
    "check_tenant_id",
]


@dataclasses.dataclass(frozen=True)
class Governance:
    """Who owns a trajectory, what it may be used for, and until when.

    `expires_at` is a unix time in seconds (None keeps the data until purged by request).
    `redaction` is filled in by the writer's redactor.
    """

    tenant: str
    classification: Classification
    legal_basis: LegalBasis
    consent: ConsentStatus
    expires_at: float | None
    training_eligible: bool
    human_review: ReviewStatus = ReviewStatus.NOT_REQUIRED
    redaction: RedactionStatus = RedactionStatus.UNSCANNED

    def __post_init__(self):
        check_tenant_id(self.tenant, "governance.tenant")
        check_enum("governance.classification", self.classification, Classification)
        check_enum("governance.legal_basis", self.legal_basis, LegalBasis)
        check_enum("governance.consent", self.consent, ConsentStatus)
        check_finite("governance.expires_at", self.expires_at, optional=True)
        if not isinstance(self.training_eligible, bool):
            raise fail("governance.training_eligible", "expected bool")
        check_enum("governance.human_review", self.human_review, ReviewStatus)
        check_enum("governance.redaction", self.redaction, RedactionStatus)
        if self.legal_basis == LegalBasis.CONSENT and self.consent == ConsentStatus.NOT_APPLICABLE:
            raise fail("governance.consent", "legal_basis 'consent' needs a consent status")

    @classmethod
    def synthetic(cls, tenant: str, *, expires_at: float | None) -> Governance:
        """Governance for simulated-environment rollouts: no data subject, trainable."""
        return cls(
            tenant=tenant,
            classification=Classification.INTERNAL,
            legal_basis=LegalBasis.SYNTHETIC,
            consent=ConsentStatus.NOT_APPLICABLE,
            expires_at=expires_at,
            training_eligible=True,
        )


@dataclasses.dataclass(frozen=True)
class Envelope:
    """The execution envelope that makes a trajectory replayable (principle 5)."""

    harness_schema: str = ""
    tool_versions: Mapping[str, str] = dataclasses.field(default_factory=dict)
    retrieval_snapshot: str = ""
    guardrail_config: str = ""
    policy_checkpoint: str = ""

    def __post_init__(self):
        for field in ("harness_schema", "retrieval_snapshot", "guardrail_config"):
            check_str(f"envelope.{field}", getattr(self, field))
        check_str("envelope.policy_checkpoint", self.policy_checkpoint)
        if not isinstance(self.tool_versions, Mapping):
            raise fail("envelope.tool_versions", "expected a mapping tool name -> version")


def _check_trajectory_id(path: str, value: Any) -> None:
    check_str(path, value, nonempty=True)
    if len(value) > _MAX_ID_CHARS or not value.isprintable():
        raise fail(path, f"must be printable, <= {_MAX_ID_CHARS} chars")


@dataclasses.dataclass(frozen=True)
class SourceRef:
    """A trajectory a derived record was made from: its tenant partition and id.

    The tenant is kept because derived data may be written to another partition (skills of the
    skill bank, relabelled turns of the demos tenant); the reference still names the source.
    """

    tenant: str
    trajectory_id: str

    def __post_init__(self):
        check_tenant_id(self.tenant, "source.tenant")
        _check_trajectory_id("source.trajectory_id", self.trajectory_id)

    def __str__(self) -> str:
        return f"{self.tenant}/{self.trajectory_id}"

    @classmethod
    def parse(cls, text: str) -> SourceRef:
        """The inverse of `str()`: "tenant/trajectory id" (tenant ids never contain "/")."""
        tenant, sep, trajectory_id = str(text).partition("/")
        if not sep:
            raise fail("source", f"expected 'tenant/trajectory_id', got {text!r}")
        return cls(tenant, trajectory_id)


@dataclasses.dataclass(frozen=True)
class TrajectoryHeader:
    """Identity, governance and replay envelope of a trajectory.

    `task` describes how to reset an environment to this episode (used by approximate replay),
    e.g. `{"env": "alfworld", "split": "train", "index": 12}`.

    `derived_from`: for derived data (a skill, a relabelled episode), the trajectories it was
    made from; its governance must be at least as strict as theirs (`atdp_io.lineage`), and
    purging a source purges it. Empty for data recorded first-hand (and in records written
    before lineage existed: the field is optional on disk).
    """

    trajectory_id: str
    governance: Governance
    created_at: float
    session_id: str = ""
    task: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    envelope: Envelope = dataclasses.field(default_factory=Envelope)
    schema_version: int = SCHEMA_VERSION
    derived_from: tuple[SourceRef, ...] = ()

    def __post_init__(self):
        _check_trajectory_id("header.trajectory_id", self.trajectory_id)
        if not isinstance(self.governance, Governance):
            raise fail("header.governance", "expected Governance")
        check_finite("header.created_at", self.created_at)
        check_str("header.session_id", self.session_id)
        if not isinstance(self.task, Mapping):
            raise fail("header.task", "expected a JSON object")
        if not isinstance(self.envelope, Envelope):
            raise fail("header.envelope", "expected Envelope")
        object.__setattr__(self, "derived_from", tuple(self.derived_from))
        for i, source in enumerate(self.derived_from):
            if not isinstance(source, SourceRef):
                raise fail(f"header.derived_from[{i}]", "expected SourceRef")
            if source == SourceRef(self.governance.tenant, self.trajectory_id):
                raise fail(f"header.derived_from[{i}]", "a trajectory cannot derive from itself")
        if len(set(self.derived_from)) != len(self.derived_from):
            raise fail("header.derived_from", "lists a source twice")
        if self.schema_version != SCHEMA_VERSION:
            raise fail(
                "header.schema_version",
                f"this reader understands version {SCHEMA_VERSION}, got {self.schema_version}",
            )


@dataclasses.dataclass(frozen=True)
class Outcome:
    """How a trajectory ended. `terminated=False` means truncated (e.g. a step limit)."""

    success: bool | None = None
    terminated: bool = True
    info: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    def __post_init__(self):
        if self.success is not None and not isinstance(self.success, bool):
            raise fail("outcome.success", "expected bool or None")
        if not isinstance(self.terminated, bool):
            raise fail("outcome.terminated", "expected bool")


def _check_target(kind: str, trajectory_id: Any, event_index: Any, *, optional: bool) -> None:
    check_str(f"{kind}.trajectory_id", trajectory_id, nonempty=True)
    check_int(f"{kind}.event_index", event_index, optional=optional, minimum=0)


@dataclasses.dataclass(frozen=True)
class LateReward:
    """A reward that arrived after the event; `event_index` None means the whole trajectory."""

    trajectory_id: str
    event_index: int | None
    reward: Reward
    timestamp: float

    def __post_init__(self):
        _check_target("late_reward", self.trajectory_id, self.event_index, optional=True)
        if not isinstance(self.reward, Reward):
            raise fail("late_reward.reward", "expected Reward")
        check_finite("late_reward.timestamp", self.timestamp)


@dataclasses.dataclass(frozen=True)
class VerdictUpdate:
    """A later judgement of a tool result: trusted, ignored, corrected or contradicted."""

    trajectory_id: str
    event_index: int
    verdict: Verdict
    timestamp: float
    note: str = ""

    def __post_init__(self):
        _check_target("verdict_update", self.trajectory_id, self.event_index, optional=False)
        check_enum("verdict_update.verdict", self.verdict, Verdict)
        check_finite("verdict_update.timestamp", self.timestamp)
        check_str("verdict_update.note", self.note)


@dataclasses.dataclass(frozen=True)
class Critique:
    """A human correction or critique of an event (or of the trajectory when event_index None)."""

    trajectory_id: str
    event_index: int | None
    text: str
    author: str
    timestamp: float

    def __post_init__(self):
        _check_target("critique", self.trajectory_id, self.event_index, optional=True)
        check_str("critique.text", self.text, nonempty=True)
        check_str("critique.author", self.author, nonempty=True)
        check_finite("critique.timestamp", self.timestamp)


@dataclasses.dataclass(frozen=True)
class GovernanceUpdate:
    """A later change of governance (review decision, consent withdrawal, shorter retention).

    Fields left None are unchanged. Tenant and redaction status cannot change after writing.
    """

    trajectory_id: str
    timestamp: float
    reason: str
    human_review: ReviewStatus | None = None
    consent: ConsentStatus | None = None
    training_eligible: bool | None = None
    classification: Classification | None = None
    expires_at: float | None = None

    def __post_init__(self):
        _check_target("governance_update", self.trajectory_id, None, optional=True)
        check_finite("governance_update.timestamp", self.timestamp)
        check_str("governance_update.reason", self.reason, nonempty=True)
        for field, enum in (
            ("human_review", ReviewStatus),
            ("consent", ConsentStatus),
            ("classification", Classification),
        ):
            if getattr(self, field) is not None:
                check_enum(f"governance_update.{field}", getattr(self, field), enum)
        if self.training_eligible is not None and not isinstance(self.training_eligible, bool):
            raise fail("governance_update.training_eligible", "expected bool or None")
        check_finite("governance_update.expires_at", self.expires_at, optional=True)
        if all(
            getattr(self, f) is None
            for f in (
                "human_review",
                "consent",
                "training_eligible",
                "classification",
                "expires_at",
            )
        ):
            raise fail("governance_update", "changes nothing: set at least one field")


Annotation = LateReward | VerdictUpdate | Critique | GovernanceUpdate
ANNOTATION_TYPES: tuple[type, ...] = (LateReward, VerdictUpdate, Critique, GovernanceUpdate)


@dataclasses.dataclass(frozen=True, eq=False)
class Trajectory:
    """A header, its events in order, an outcome once closed, and late annotations (as read)."""

    header: TrajectoryHeader
    events: tuple[Event, ...]
    outcome: Outcome | None = None
    annotations: tuple[Annotation, ...] = ()

    def __post_init__(self):
        if not isinstance(self.header, TrajectoryHeader):
            raise fail("trajectory.header", "expected TrajectoryHeader")
        object.__setattr__(self, "events", tuple(self.events))
        object.__setattr__(self, "annotations", tuple(self.annotations))
        for i, event in enumerate(self.events):
            if not isinstance(event, Event):
                raise fail(f"trajectory.events[{i}]", f"expected Event, got {type(event).__name__}")
        if self.outcome is not None and not isinstance(self.outcome, Outcome):
            raise fail("trajectory.outcome", "expected Outcome or None")
        for i, note in enumerate(self.annotations):
            if not isinstance(note, ANNOTATION_TYPES):
                raise fail(f"trajectory.annotations[{i}]", "expected an Annotation record")
            if note.trajectory_id != self.header.trajectory_id:
                raise fail(f"trajectory.annotations[{i}]", "points at another trajectory")

    @property
    def trajectory_id(self) -> str:
        return self.header.trajectory_id

    @property
    def closed(self) -> bool:
        return self.outcome is not None

    def llm_events(self) -> list[tuple[int, Event]]:
        """`(event_index, event)` for each LLM call, in order."""
        return [(i, e) for i, e in enumerate(self.events) if e.kind == EventKind.LLM_CALL]
