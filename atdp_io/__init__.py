"""ATDP: the agent trajectory data protocol, with governance, a TensorStore buffer and loaders.

Writers (rollout loop, serving data proxy) append through `AtdpStore.writer`; the learner reads
through the grain loaders in `atdp_io.loader`. See docs/atdp_io.md.
"""

from atdp_io.access import AccessDenied, Grant
from atdp_io.governance import EligibilityPolicy
from atdp_io.layout import StoreConfig
from atdp_io.locking import PartitionLockedError
from atdp_io.reader import PartitionReader, TrajectoryNotFound
from atdp_io.redaction import Redactor
from atdp_io.schema import (
    SCHEMA_VERSION,
    Action,
    ActionKind,
    Classification,
    ConsentStatus,
    Critique,
    DecodingParams,
    Envelope,
    Event,
    EventKind,
    EventMetadata,
    Governance,
    GovernanceUpdate,
    LateReward,
    LegalBasis,
    LLMCall,
    Outcome,
    RedactionStatus,
    ReplayClass,
    ReviewStatus,
    Reward,
    SchemaError,
    SourceRef,
    ToolCall,
    Trajectory,
    TrajectoryHeader,
    Verdict,
    VerdictUpdate,
)
from atdp_io.store import AtdpStore
from atdp_io.writer import (
    PartitionWriter,
    TrajectorySession,
    WriterError,
    WriterFencedError,
)

__all__ = [
    "SCHEMA_VERSION",
    "AccessDenied",
    "Action",
    "ActionKind",
    "AtdpStore",
    "Classification",
    "ConsentStatus",
    "Critique",
    "DecodingParams",
    "EligibilityPolicy",
    "Envelope",
    "Event",
    "EventKind",
    "EventMetadata",
    "Governance",
    "GovernanceUpdate",
    "Grant",
    "LLMCall",
    "LateReward",
    "LegalBasis",
    "Outcome",
    "PartitionLockedError",
    "PartitionReader",
    "PartitionWriter",
    "RedactionStatus",
    "Redactor",
    "ReplayClass",
    "ReviewStatus",
    "Reward",
    "SchemaError",
    "SourceRef",
    "StoreConfig",
    "ToolCall",
    "Trajectory",
    "TrajectoryHeader",
    "TrajectoryNotFound",
    "TrajectorySession",
    "Verdict",
    "VerdictUpdate",
    "WriterError",
    "WriterFencedError",
]
