"""In-memory index of a partition's record log, built incrementally from committed records.

Both the writer (to validate appends against what exists) and readers (to find trajectories)
keep one. Only headers and annotations are decoded here; event payloads stay on storage until a
trajectory is read.
"""

from __future__ import annotations

import dataclasses
import struct
from collections.abc import Callable

import numpy as np

from atdp_io import codec, governance
from atdp_io.layout import Col, RecordKind
from atdp_io.schema import (
    Annotation,
    GovernanceUpdate,
    LateReward,
    RedactionStatus,
    SchemaError,
    TrajectoryHeader,
)


def float_bits(value: float) -> int:
    """The int64 whose bits are the float64 `value` (how the record table stores floats)."""
    return struct.unpack("<q", struct.pack("<d", value))[0]


def bits_float(bits: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(bits, np.int64).view(np.float64)


@dataclasses.dataclass
class TrajectoryEntry:
    """What the index knows about one trajectory (its rows in the record log)."""

    row: int
    header: TrajectoryHeader | None  # None once purged
    event_rows: list[int] = dataclasses.field(default_factory=list)
    close_row: int | None = None
    annotations: list[Annotation] = dataclasses.field(default_factory=list)
    annotation_rows: list[int] = dataclasses.field(default_factory=list)
    purged: bool = False

    @property
    def trajectory_id(self) -> str:
        return self.header.trajectory_id if self.header else f"<purged row {self.row}>"

    @property
    def closed(self) -> bool:
        return self.close_row is not None

    @property
    def n_events(self) -> int:
        return len(self.event_rows)

    def governance(self):
        """Header governance with every committed governance update folded in."""
        updates = [a for a in self.annotations if isinstance(a, GovernanceUpdate)]
        return governance.apply_updates(self.header.governance, updates)

    def redaction(self, records: np.ndarray) -> RedactionStatus:
        """Redaction status of the whole trajectory (its header and every event)."""
        codes = records[[self.row, *self.event_rows], Col.REDACTION]
        statuses = list(RedactionStatus)
        return governance.combine_redaction(statuses[int(c)] for c in codes)

    def late_rewards(self) -> list[LateReward]:
        return [a for a in self.annotations if isinstance(a, LateReward)]


class PartitionIndex:
    """Trajectories by id and by row, plus the raw record table, for committed records."""

    def __init__(self):
        self._records = np.zeros((0, len(Col)), np.int64)
        self.n_records = 0
        self.by_id: dict[str, TrajectoryEntry] = {}
        self.by_row: dict[int, TrajectoryEntry] = {}
        self.close_order: list[int] = []  # trajectory rows in commit order of their CLOSE

    @property
    def records(self) -> np.ndarray:
        """`[n_records, N_COLUMNS] int64` view of the committed record table."""
        return self._records[: self.n_records]

    def apply(self, records: np.ndarray, meta_of: Callable[[int], bytes]) -> list[int]:
        """Indexes records appended after `n_records`; returns rows of newly closed trajectories.

        `meta_of(row)` returns the stored JSON bytes of a record (needed for OPEN and ANNOTATION).
        """
        first = self.n_records
        self._grow(first + records.shape[0])
        self._records[first : first + records.shape[0]] = records
        self.n_records = first + records.shape[0]
        purged_now = set(records[records[:, Col.KIND] == RecordKind.PURGE][:, Col.TRAJ].tolist())
        closed = []
        for offset, record in enumerate(records):
            row = first + offset
            kind, traj = int(record[Col.KIND]), int(record[Col.TRAJ])
            if kind == RecordKind.OPEN:
                self._open(row, traj in purged_now, meta_of)
                continue
            entry = self.by_row.get(traj)
            if entry is None:
                raise SchemaError(f"record {row}: points at unknown trajectory row {traj}")
            if kind == RecordKind.EVENT:
                entry.event_rows.append(row)
            elif kind == RecordKind.CLOSE:
                entry.close_row = row
                self.close_order.append(traj)
                closed.append(traj)
            elif kind == RecordKind.ANNOTATION:
                entry.annotation_rows.append(row)
                if not entry.purged:
                    raw = meta_of(row)
                    if _is_erased(raw):
                        self._mark_purged(entry)
                    else:
                        note = codec.annotation_from_json(codec.loads(raw, f"record {row}"))
                        entry.annotations.append(note)
            elif kind == RecordKind.PURGE:
                self._mark_purged(entry)
            else:
                raise SchemaError(f"record {row}: unknown record kind {kind}")
        return closed

    def _open(self, row: int, purged: bool, meta_of: Callable[[int], bytes]) -> None:
        header = None
        if not purged:
            raw = meta_of(row)
            if _is_erased(raw):
                purged = True
            else:
                header = codec.from_json(TrajectoryHeader, codec.loads(raw, f"record {row}"))
        entry = TrajectoryEntry(row=row, header=header, purged=purged)
        self.by_row[row] = entry
        if header is not None:
            self.by_id[header.trajectory_id] = entry

    def _mark_purged(self, entry: TrajectoryEntry) -> None:
        if entry.header is not None:
            self.by_id.pop(entry.header.trajectory_id, None)
        entry.purged = True
        entry.header = None
        entry.annotations = []

    def _grow(self, size: int) -> None:
        if size > self._records.shape[0]:
            bigger = np.zeros((max(size, 2 * self._records.shape[0], 1024), len(Col)), np.int64)
            bigger[: self.n_records] = self._records[: self.n_records]
            self._records = bigger


def _is_erased(raw: bytes) -> bool:
    # Purge overwrites a record's bytes with zeros; valid JSON never starts with a NUL byte.
    return not raw or raw[0] == 0
