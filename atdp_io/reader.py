"""Reading one tenant partition: follow the committed head, decode whole trajectories.

A reader never looks past `head.json`, so it sees exactly the committed prefix of the record log
while a writer appends. `refresh()` is incremental: it reads only records committed since the
last call. Trajectories are read whole, with all token ranges and JSON payloads fetched in one
TensorStore batch.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import tensorstore as ts

from atdp_io import codec, layout
from atdp_io.access import AccessDenied
from atdp_io.index import PartitionIndex, TrajectoryEntry
from atdp_io.layout import Col, Head, PartitionArrays, RecordKind
from atdp_io.schema import Event, Outcome, SchemaError, Trajectory

_MERGE_GAP = 4096  # read neighbouring ranges as one when the gap is this small (elements)


class TrajectoryNotFound(KeyError):
    """No committed, unpurged trajectory with this id in the partition."""


def read_head(kvstore: ts.KvStore, tenant: str) -> tuple[Head | None, bytes]:
    raw, generation = layout.read_key(kvstore, "head.json")
    if raw is None:
        return None, generation
    return Head.from_bytes(raw, f"partition {tenant!r}"), generation


def sync_index(index: PartitionIndex, arrays: PartitionArrays, head: Head) -> list[int]:
    """Brings `index` up to `head`; returns rows of trajectories closed by the new records."""
    if head.records <= index.n_records:
        return []
    records = arrays.records[index.n_records : head.records].read().result()
    starts, lengths = records[:, Col.META_START], records[:, Col.META_LEN]
    wanted = np.isin(records[:, Col.KIND], (RecordKind.OPEN, RecordKind.ANNOTATION)) & (lengths > 0)
    payloads: dict[int, bytes] = {}
    if wanted.any():
        lo = int(starts[wanted].min())
        hi = int((starts[wanted] + lengths[wanted]).max())
        span = arrays.meta[lo:hi].read().result().tobytes()
        first = index.n_records
        for offset in np.flatnonzero(wanted):
            start, length = int(starts[offset]) - lo, int(lengths[offset])
            payloads[first + int(offset)] = span[start : start + length]
    return index.apply(records, payloads.__getitem__)


class PartitionReader:
    """Read access to one tenant partition (construct through `AtdpStore.reader`)."""

    def __init__(
        self,
        partition: Mapping[str, Any],
        tenant: str,
        config: layout.StoreConfig,
        *,
        content: bool = True,
        context: ts.Context | None = None,
    ):
        self.tenant = tenant
        self.content = content  # False for maintenance readers: index and counts, no payloads
        self._partition = dict(partition)
        self._config = config
        self._context = context or ts.Context()
        self._kvstore = ts.KvStore.open(self._partition, context=self._context).result()
        self._arrays: PartitionArrays | None = None
        self.index = PartitionIndex()
        self.head = Head(tenant=tenant)

    def refresh(self) -> list[int]:
        """Reads records committed since the last refresh; returns rows of newly closed ones."""
        head, _ = read_head(self._kvstore, self.tenant)
        if head is None:
            return []
        if self._arrays is None:
            self._arrays = layout.open_arrays(
                self._partition, self._config, create=False, context=self._context
            )
        self.head = head
        return sync_index(self.index, self._arrays, head)

    def entries(self, *, closed_only: bool = True) -> list[TrajectoryEntry]:
        """Unpurged trajectories in order of their OPEN record."""
        return [
            e for e in self.index.by_id.values() if not e.purged and (e.closed or not closed_only)
        ]

    def trajectory_ids(self, *, closed_only: bool = True) -> list[str]:
        return [e.trajectory_id for e in self.entries(closed_only=closed_only)]

    def entry(self, trajectory_id: str) -> TrajectoryEntry:
        entry = self.index.by_id.get(trajectory_id)
        if entry is None:
            raise TrajectoryNotFound(
                f"trajectory {trajectory_id!r} is not committed in partition {self.tenant!r}"
            )
        return entry

    def read(self, trajectory_id: str) -> Trajectory:
        """The trajectory as committed, with its late annotations (open ones have no outcome)."""
        return self.read_entries([self.entry(trajectory_id)])[0]

    def read_entries(self, entries: Sequence[TrajectoryEntry]) -> list[Trajectory]:
        """Decodes several trajectories with one batched fetch of their bytes."""
        if not self.content:
            raise AccessDenied(f"this reader of {self.tenant!r} has no content access")
        if not entries:
            return []
        if self._arrays is None:
            raise TrajectoryNotFound(f"partition {self.tenant!r} has no committed data")
        records = self.index.records
        meta_ranges, token_ranges = [], []
        for entry in entries:
            if entry.purged:
                raise TrajectoryNotFound(f"trajectory row {entry.row} was purged")
            for row in _payload_rows(entry):
                rec = records[row]
                meta_ranges.append((int(rec[Col.META_START]), int(rec[Col.META_LEN])))
                n_tokens = int(rec[Col.INPUT_LEN] + rec[Col.OUTPUT_LEN])
                if n_tokens:
                    token_ranges.append((int(rec[Col.TOKEN_START]), n_tokens))
        arrays = self._arrays
        fetched = _fetch(
            {
                "meta": (arrays.meta, meta_ranges),
                **{name: (getattr(arrays, name), token_ranges) for name in layout.TOKEN_STREAMS},
            }
        )
        return [_decode_trajectory(entry, records, fetched) for entry in entries]


def _payload_rows(entry: TrajectoryEntry) -> list[int]:
    return entry.event_rows + ([entry.close_row] if entry.closed else [])


@dataclasses.dataclass
class _Fetched:
    """Merged reads of one array, addressable by the original (start, length) ranges."""

    spans: list[tuple[int, np.ndarray]]
    starts: np.ndarray

    def get(self, start: int, length: int) -> np.ndarray:
        i = int(np.searchsorted(self.starts, start, side="right")) - 1
        span_start, data = self.spans[i]
        return data[start - span_start : start - span_start + length]


def _merge(ranges: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
    merged: list[list[int]] = []
    for start, length in sorted(r for r in ranges if r[1] > 0):
        if merged and start <= merged[-1][1] + _MERGE_GAP:
            merged[-1][1] = max(merged[-1][1], start + length)
        else:
            merged.append([start, start + length])
    return [(a, b) for a, b in merged]


def _fetch(requests: Mapping[str, tuple[ts.TensorStore, list]]) -> dict[str, _Fetched]:
    batch = ts.Batch()
    pending = {}
    for name, (array, ranges) in requests.items():
        spans = _merge(ranges)
        pending[name] = [(a, array[a:b].read(batch=batch)) for a, b in spans]
    batch.submit()
    out = {}
    for name, futures in pending.items():
        spans = [(a, f.result()) for a, f in futures]
        out[name] = _Fetched(spans, np.asarray([a for a, _ in spans], np.int64))
    return out


def _decode_trajectory(
    entry: TrajectoryEntry, records: np.ndarray, fetched: dict[str, _Fetched]
) -> Trajectory:
    where = f"trajectory {entry.trajectory_id!r}"
    meta = fetched["meta"]
    events: list[Event] = []
    previous_context: np.ndarray | None = None
    for row in entry.event_rows:
        rec = records[row]
        payload = meta.get(int(rec[Col.META_START]), int(rec[Col.META_LEN])).tobytes()
        data = codec.loads(payload, f"{where} event {len(events)}")
        arrays = None
        prefix, n_in, n_out = (int(rec[c]) for c in (Col.PREFIX_LEN, Col.INPUT_LEN, Col.OUTPUT_LEN))
        if prefix + n_in > 0:
            start = int(rec[Col.TOKEN_START])
            streams = {n: fetched[n].get(start, n_in + n_out) for n in layout.TOKEN_STREAMS}
            suffix = streams["tokens"][:n_in]
            if prefix:
                if previous_context is None or previous_context.shape[0] < prefix:
                    raise SchemaError(f"{where} event {len(events)}: dangling token prefix")
                input_ids = np.concatenate([previous_context[:prefix], suffix])
            else:
                input_ids = suffix.copy()
            arrays = codec.LLMArrays(
                input_ids=input_ids,
                output_ids=streams["tokens"][n_in:].copy(),
                output_logprobs=streams["logprobs"][n_in:].copy(),
                output_versions=streams["versions"][n_in:].copy(),
                loss_mask=streams["loss_mask"][n_in:].copy(),
            )
            previous_context = np.concatenate([input_ids, arrays.output_ids])
        events.append(codec.event_from_json(data, arrays, f"{where}.events[{len(events)}]"))
    outcome = None
    if entry.closed:
        rec = records[entry.close_row]
        payload = meta.get(int(rec[Col.META_START]), int(rec[Col.META_LEN])).tobytes()
        outcome = codec.from_json(Outcome, codec.loads(payload, f"{where} outcome"), "outcome")
    return Trajectory(
        header=entry.header, events=tuple(events), outcome=outcome, annotations=entry.annotations
    )
