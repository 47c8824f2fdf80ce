"""Records -> storage form: one row of the record table, JSON payload bytes, token streams.

Pure functions, no I/O: the writer assigns positions and commits. An LLM call's input usually
repeats the previous call's input + output (a growing multi-turn context), so only the part after
the longest common prefix with that previous context is stored; `PREFIX_LEN` says how many tokens
to take from it when reading. Nothing is lost: a prompt that does not extend simply shares less.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from atdp_io import codec, layout
from atdp_io.index import float_bits
from atdp_io.layout import AnnotationKind, RecordKind
from atdp_io.redaction import RedactionReport, Redactor
from atdp_io.schema import (
    Annotation,
    Critique,
    Event,
    EventKind,
    GovernanceUpdate,
    LateReward,
    LLMCall,
    Outcome,
    RedactionStatus,
    TrajectoryHeader,
    VerdictUpdate,
)

_EVENT_KIND_CODE = {kind: i + 1 for i, kind in enumerate(EventKind)}
_ANNOTATION_KIND = {
    LateReward: AnnotationKind.LATE_REWARD,
    VerdictUpdate: AnnotationKind.VERDICT_UPDATE,
    Critique: AnnotationKind.CRITIQUE,
    GovernanceUpdate: AnnotationKind.GOVERNANCE_UPDATE,
}


@dataclasses.dataclass(frozen=True, eq=False)
class EncodedRecord:
    """One record before it has a position; `streams` maps TOKEN_STREAMS names to `[n]` arrays."""

    kind: RecordKind
    traj_row: int
    meta: bytes
    event: int = -1
    streams: dict[str, tuple[np.ndarray, ...]] | None = None  # pieces, concatenated at commit
    lengths: tuple[int, int, int] = (0, 0, 0)  # prefix (not stored), stored input, output
    versions: tuple[int, int] = (-1, -1)
    value: float = 0.0
    subkind: int = 0
    redaction: RedactionStatus = RedactionStatus.UNSCANNED

    @property
    def n_tokens(self) -> int:
        return self.lengths[1] + self.lengths[2]

    def row(self, token_start: int, meta_start: int) -> tuple[int, ...]:
        """The record-table row (`N_COLUMNS` ints, in `Col` order) once positions are known."""
        return (
            self.kind,
            self.traj_row,
            self.event,
            token_start,
            *self.lengths,
            meta_start,
            len(self.meta),
            *self.versions,
            float_bits(self.value),
            self.subkind,
            layout.REDACTION_CODES[self.redaction],
        )


def encode_open(header: TrajectoryHeader, traj_row: int) -> EncodedRecord:
    expires = header.governance.expires_at
    return EncodedRecord(
        RecordKind.OPEN,
        traj_row,
        codec.dumps_record(codec.to_json_unchecked(header), header),
        value=math.nan if expires is None else expires,
        redaction=header.governance.redaction,
    )


@dataclasses.dataclass(frozen=True, eq=False)
class PreparedEvent:
    """An event after redaction, serialized: everything but its position and token prefix."""

    event: Event
    meta: bytes
    llm: LLMCall | None
    redaction: RedactionStatus


def prepare_event(event: Event, redactor: Redactor) -> tuple[PreparedEvent, RedactionReport]:
    """Redacts and serializes an event (no shared state: runs outside the writer's lock)."""
    payload, llm, report = redactor.prepare_event(event)
    meta = codec.dumps_record(payload, event)
    return PreparedEvent(event, meta, llm, report.status), report


def encode_event(
    prepared: PreparedEvent,
    traj_row: int,
    event_index: int,
    previous_context: np.ndarray | None,
) -> tuple[EncodedRecord, np.ndarray | None]:
    """The event's record and the context (`[P + N]` ids) the next LLM call is compared with."""
    event, meta, llm = prepared.event, prepared.meta, prepared.llm
    fields = {
        "event": event_index,
        "value": float(sum(r.value for r in event.rewards)),
        "subkind": _EVENT_KIND_CODE[event.kind],
        "redaction": prepared.redaction,
    }
    if llm is None:
        return EncodedRecord(RecordKind.EVENT, traj_row, meta, **fields), previous_context
    prefix = common_prefix(previous_context, llm.input_ids)
    suffix = llm.input_ids[prefix:]
    n_in, n_out = suffix.shape[0], llm.output_ids.shape[0]
    streams = {
        "tokens": (suffix, llm.output_ids),
        "logprobs": (_filled(n_in, np.float32, 0), llm.output_logprobs),
        "loss_mask": (_filled(n_in, np.int8, 0), llm.loss_mask),
        "versions": (_filled(n_in, np.int32, -1), llm.output_versions),
    }
    versions = (-1, -1)
    if n_out:
        versions = (int(llm.output_versions.min()), int(llm.output_versions.max()))
    record = EncodedRecord(
        RecordKind.EVENT,
        traj_row,
        meta,
        streams=streams,
        lengths=(prefix, n_in, n_out),
        versions=versions,
        **fields,
    )
    return record, llm.context_ids


def encode_close(outcome: Outcome, traj_row: int) -> EncodedRecord:
    return EncodedRecord(RecordKind.CLOSE, traj_row, codec.dumps(codec.to_json(outcome)))


def encode_annotation(note: Annotation, traj_row: int) -> EncodedRecord:
    event_index = getattr(note, "event_index", None)
    return EncodedRecord(
        RecordKind.ANNOTATION,
        traj_row,
        codec.dumps(codec.annotation_to_json(note)),
        event=-1 if event_index is None else event_index,
        value=note.reward.value if isinstance(note, LateReward) else 0.0,
        subkind=_ANNOTATION_KIND[type(note)],
    )


def encode_purge(traj_row: int, reason: str, timestamp: float) -> EncodedRecord:
    payload = codec.dumps({"reason": reason, "timestamp": timestamp})
    return EncodedRecord(RecordKind.PURGE, traj_row, payload)


_FILLED: dict[tuple, np.ndarray] = {}


def _filled(n: int, dtype: type, value: int) -> np.ndarray:
    """A read-only `[n]` view of a constant array (no allocation per record)."""
    key = (np.dtype(dtype).str, value)
    buffer = _FILLED.get(key)
    if buffer is None or buffer.shape[0] < n:
        buffer = np.full(max(n, 2 * (0 if buffer is None else buffer.shape[0]), 4096), value, dtype)
        buffer.flags.writeable = False
        _FILLED[key] = buffer
    return buffer[:n]


def common_prefix(previous: np.ndarray | None, current: np.ndarray) -> int:
    """Length of the longest common prefix of two id arrays (0 when `previous` is None)."""
    if previous is None:
        return 0
    n = min(previous.shape[0], current.shape[0])
    mismatch = np.flatnonzero(previous[:n] != current[:n])
    return int(mismatch[0]) if mismatch.size else n
