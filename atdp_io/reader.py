"""Reading one tenant partition: follow the committed head, decode whole trajectories.

A reader never looks past `head.json`, so it sees exactly the committed prefix of the record log
while a writer appends. `refresh()` is incremental: it reads only records committed since the
last call. Trajectories are read whole, with all token ranges and JSON payloads fetched in one
TensorStore batch.

Governance is enforced here, at read time, for the reader's purpose (`governance.refusal_reason`;
`now` defaults to the store clock and every method takes it explicitly too): listings
(`entries`, `trajectory_ids`) leave out what the purpose may not serve, and reads of explicit
trajectories (`read`, `read_entries`, `read_training_views`) raise `IneligibleTrajectoryError`
naming each refused id and read nothing. Maintenance readers (no content access) list everything.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import tensorstore as ts

from atdp_io import codec, layout
from atdp_io.access import AccessDenied
from atdp_io.governance import (
    OPERATOR_REVIEW,
    TRAINING,
    EligibilityPolicy,
    IneligibleTrajectoryError,
    refusal_reason,
)
from atdp_io.index import PartitionIndex, TrajectoryEntry, bits_float
from atdp_io.layout import Col, Head, PartitionArrays, RecordKind
from atdp_io.rows import LLMTurn, TrainingView, sampled_call
from atdp_io.schema import (
    DecodingParams,
    Event,
    Outcome,
    Reward,
    SchemaError,
    Trajectory,
)

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
    wanted = np.isin(records[:, Col.KIND], (RecordKind.OPEN, RecordKind.ANNOTATION))
    ranges = records[wanted][:, [Col.META_START, Col.META_LEN]]
    # Only headers and annotations: event payloads (most of the bytes) are not read here.
    fetched = _fetch({"meta": (arrays.meta, ranges)})["meta"] if wanted.any() else None

    def meta_of(row: int) -> bytes:
        rec = records[row - first]
        return fetched.get(int(rec[Col.META_START]), int(rec[Col.META_LEN])).tobytes()

    first = index.n_records
    return index.apply(records, meta_of)


class PartitionReader:
    """Read access to one tenant partition for one purpose (construct through `AtdpStore.reader`).

    `policy` is what a `training` reader accepts; `clock` gives `now` for expiry checks;
    `audit(action, detail)` records each operator-review read of a trajectory another purpose
    would refuse.
    """

    def __init__(
        self,
        partition: Mapping[str, Any],
        tenant: str,
        config: layout.StoreConfig,
        *,
        content: bool = True,
        context: ts.Context | None = None,
        purpose: str = TRAINING,
        policy: EligibilityPolicy | None = None,
        clock: Callable[[], float] = time.time,
        audit: Callable[[str, dict], None] | None = None,
    ):
        self.tenant = tenant
        self.content = content  # False for maintenance readers: index and counts, no payloads
        self.purpose = purpose
        self.policy = policy or EligibilityPolicy()
        self._clock = clock
        self._audit = audit
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

    def entries(
        self, *, closed_only: bool = True, now: float | None = None
    ) -> list[TrajectoryEntry]:
        """Unpurged trajectories this reader may serve, in order of their OPEN record."""
        listed = [
            e for e in self.index.by_id.values() if not e.purged and (e.closed or not closed_only)
        ]
        if not self.content:
            return listed  # maintenance: counts and ids only, never content
        now = self._clock() if now is None else now
        return [e for e in listed if self.refusal(e, now) is None]

    def trajectory_ids(self, *, closed_only: bool = True, now: float | None = None) -> list[str]:
        return [e.trajectory_id for e in self.entries(closed_only=closed_only, now=now)]

    def refusal(
        self, entry: TrajectoryEntry, now: float, *, purpose: str | None = None
    ) -> str | None:
        """Why this reader (or one for `purpose`) may not serve `entry` at `now`, or None."""
        return refusal_reason(
            purpose or self.purpose,
            entry.governance(),
            entry.redaction(self.index.records),
            now,
            self.policy,
        )

    def eligible_entries(
        self, *, closed_only: bool = True, now: float | None = None
    ) -> list[TrajectoryEntry]:
        """The entries a training job may use at `now` (an `eligible_only` export)."""
        now = self._clock() if now is None else now
        return [
            e
            for e in self.entries(closed_only=closed_only, now=now)
            if self.refusal(e, now, purpose=TRAINING) is None
        ]

    def entry(self, trajectory_id: str) -> TrajectoryEntry:
        entry = self.index.by_id.get(trajectory_id)
        if entry is None:
            raise TrajectoryNotFound(
                f"trajectory {trajectory_id!r} is not committed in partition {self.tenant!r}"
            )
        return entry

    def read(self, trajectory_id: str, *, now: float | None = None) -> Trajectory:
        """The trajectory as committed, with its late annotations (open ones have no outcome)."""
        return self.read_entries([self.entry(trajectory_id)], now=now)[0]

    def read_entries(
        self, entries: Sequence[TrajectoryEntry], *, now: float | None = None
    ) -> list[Trajectory]:
        """Decodes several trajectories with one batched fetch of their bytes."""
        self._check_servable(entries, now)
        fetched = self._fetch_entries(entries, meta=True)
        records = self.index.records
        return [_decode_trajectory(entry, records, fetched) for entry in entries]

    def read_training_views(
        self,
        entries: Sequence[TrajectoryEntry],
        *,
        reward_sources: bool = False,
        now: float | None = None,
    ) -> list[TrainingView]:
        """The loader's fast path: token streams and rewards, no event records decoded.

        Without `reward_sources` each event's rewards come summed from the record table (one
        reward of source "*"), and only LLM calls' JSON payloads are read, for their decoding
        transform: a payload is parsed only when it records `sampled_logprobs` (a byte search
        decides), so calls without them cost a read and a scan, never a JSON decode.
        """
        self._check_servable(entries, now)
        fetched = self._fetch_entries(entries, meta=True if reward_sources else "llm")
        records = self.index.records
        return [_training_view(e, records, fetched, reward_sources) for e in entries]

    def _check_servable(self, entries: Sequence[TrajectoryEntry], now: float | None) -> None:
        """Raises `IneligibleTrajectoryError` unless every entry may be served now; audits an
        operator review's reads of trajectories a training reader would refuse."""
        if not self.content:
            raise AccessDenied(f"this reader of {self.tenant!r} has no content access")
        now = self._clock() if now is None else now
        live = [e for e in entries if not e.purged]  # purged ones fail in _fetch_entries
        refused = {e.trajectory_id: r for e in live if (r := self.refusal(e, now)) is not None}
        if refused:
            raise IneligibleTrajectoryError(self.tenant, self.purpose, refused)
        if self.purpose == OPERATOR_REVIEW and self._audit is not None:
            exceptions = {
                e.trajectory_id: r
                for e in live
                if (r := self.refusal(e, now, purpose=TRAINING)) is not None
            }
            if exceptions:
                self._audit("operator_read_ineligible", {"trajectories": exceptions, "now": now})

    def _fetch_entries(self, entries: Sequence[TrajectoryEntry], *, meta: bool | str) -> dict:
        """Token streams of `entries`, and JSON payloads: every record's (`meta` True), only LLM
        calls' ("llm") or none (False)."""
        if not self.content:
            raise AccessDenied(f"this reader of {self.tenant!r} has no content access")
        if entries and self._arrays is None:
            raise TrajectoryNotFound(f"partition {self.tenant!r} has no committed data")
        if not entries:
            return {}
        purged = [e.row for e in entries if e.purged]
        if purged:
            raise TrajectoryNotFound(f"trajectory rows {purged} were purged")
        recs = self.index.records[[row for e in entries for row in _payload_rows(e)]]
        n_tokens = recs[:, Col.INPUT_LEN] + recs[:, Col.OUTPUT_LEN]
        token_ranges = np.stack([recs[:, Col.TOKEN_START], n_tokens], 1)
        arrays = self._arrays
        requests = {name: (getattr(arrays, name), token_ranges) for name in layout.TOKEN_STREAMS}
        if meta:
            meta_recs = recs[recs[:, Col.PREFIX_LEN] + recs[:, Col.INPUT_LEN] > 0]
            meta_recs = recs if meta is True else meta_recs
            requests["meta"] = (arrays.meta, meta_recs[:, [Col.META_START, Col.META_LEN]])
        return _fetch(requests)


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

    def contains(self, needle: bytes) -> bool:
        """Whether any fetched byte span holds `needle` (one scan per span, cached)."""
        found = self.__dict__.setdefault("_found", {})
        if needle not in found:
            found[needle] = any(needle in data.tobytes() for _, data in self.spans)
        return found[needle]


def _merge(ranges: np.ndarray) -> list[tuple[int, int]]:
    """Merges `[k, 2]` (start, length) ranges into sorted `(start, end)` spans to read."""
    ranges = ranges[ranges[:, 1] > 0]
    if not ranges.shape[0]:
        return []
    ranges = ranges[np.argsort(ranges[:, 0], kind="stable")]
    starts, ends = ranges[:, 0], np.maximum.accumulate(ranges[:, 0] + ranges[:, 1])
    new_span = np.ones(starts.shape[0], bool)
    new_span[1:] = starts[1:] > ends[:-1] + _MERGE_GAP
    first = np.flatnonzero(new_span)
    last = np.append(first[1:], starts.shape[0]) - 1
    return list(zip(starts[first].tolist(), ends[last].tolist(), strict=True))


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


def _llm_arrays(
    rec: np.ndarray, fetched: dict[str, _Fetched], previous_context: np.ndarray | None, where: str
) -> codec.LLMArrays | None:
    """An LLM event's token streams, its input rebuilt from the shared prefix; else None."""
    prefix, n_in, n_out = (int(rec[c]) for c in (Col.PREFIX_LEN, Col.INPUT_LEN, Col.OUTPUT_LEN))
    if prefix + n_in == 0:
        return None
    start = int(rec[Col.TOKEN_START])
    streams = {n: fetched[n].get(start, n_in + n_out) for n in layout.TOKEN_STREAMS}
    suffix = streams["tokens"][:n_in]
    if prefix:
        if previous_context is None or previous_context.shape[0] < prefix:
            raise SchemaError(f"{where}: dangling token prefix")
        input_ids = np.concatenate([previous_context[:prefix], suffix])
    else:
        input_ids = suffix.copy()
    return codec.LLMArrays(
        input_ids=input_ids,
        output_ids=streams["tokens"][n_in:].copy(),
        output_logprobs=streams["logprobs"][n_in:].copy(),
        output_versions=streams["versions"][n_in:].copy(),
        loss_mask=streams["loss_mask"][n_in:].copy(),
    )


def _chained_turns(
    recs: np.ndarray, event_indices: np.ndarray, fetched: dict
) -> tuple[LLMTurn, ...] | None:
    """Turns as views of one flat context when every call extends the previous one, else None.

    Stored segments of a fully extending trajectory concatenate to its final context (that is
    how the writer stores them), so no input needs rebuilding.
    """
    lengths = recs[:, Col.INPUT_LEN] + recs[:, Col.OUTPUT_LEN]
    offsets = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    if not np.array_equal(recs[:, Col.PREFIX_LEN], offsets):
        return None
    starts = recs[:, Col.TOKEN_START]
    flat = {}
    for name in layout.TOKEN_STREAMS:
        if np.array_equal(starts[1:], starts[:-1] + lengths[:-1]):  # contiguous on storage
            flat[name] = fetched[name].get(int(starts[0]), int(lengths.sum()))
        else:
            flat[name] = np.concatenate(
                [fetched[name].get(int(s), int(n)) for s, n in zip(starts, lengths, strict=True)]
            )
    turns = []
    for k, event_index in enumerate(event_indices.tolist()):
        begin = int(offsets[k] + recs[k, Col.INPUT_LEN])
        end = int(offsets[k] + lengths[k])
        turns.append(
            LLMTurn(
                event_index,
                flat["tokens"][:begin],
                flat["tokens"][begin:end],
                flat["logprobs"][begin:end],
                flat["versions"][begin:end],
                flat["loss_mask"][begin:end],
            )
        )
    return tuple(turns)


def _training_view(
    entry: TrajectoryEntry, records: np.ndarray, fetched: dict, reward_sources: bool
) -> TrainingView:
    events = records[entry.event_rows]
    is_llm = events[:, Col.PREFIX_LEN] + events[:, Col.INPUT_LEN] > 0
    llm_indices = np.flatnonzero(is_llm)
    turns = _chained_turns(events[is_llm], llm_indices, fetched) if llm_indices.size else ()
    chained = turns is not None
    if turns is None:
        turns, context = [], None
        for index in llm_indices.tolist():
            where = f"trajectory {entry.trajectory_id!r}"
            arrays = _llm_arrays(events[index], fetched, context, where)
            turns.append(LLMTurn(index, *arrays))
            context = np.concatenate([arrays.input_ids, arrays.output_ids])
    if fetched["meta"].contains(_SAMPLED_KEY):  # else no call of the batch recorded any
        turns = tuple(_with_sampling(t, events[t.event_index], fetched, entry) for t in turns)
    rewards = []
    if reward_sources:
        for index, rec in enumerate(events):
            raw = fetched["meta"].get(int(rec[Col.META_START]), int(rec[Col.META_LEN]))
            for reward in codec.loads(raw.tobytes(), f"event {index}").get("rewards", ()):
                rewards.append((index, Reward(float(reward["value"]), reward.get("source", "env"))))
    else:
        totals = bits_float(events[:, Col.VALUE])
        rewards = [(int(i), Reward(float(totals[i]), "*")) for i in np.flatnonzero(totals)]
    rewards += [(note.event_index, note.reward) for note in entry.late_rewards()]
    return TrainingView(
        entry.trajectory_id, tuple(turns), tuple(rewards), extends=True if chained else None
    )


_SAMPLED_KEY = b'"sampled_logprobs"'


def _with_sampling(turn: LLMTurn, rec: np.ndarray, fetched: dict, entry: TrajectoryEntry):
    """`turn` with its call's behaviour log-probs, decoding transform and grammar, when
    recorded."""
    raw = fetched["meta"].get(int(rec[Col.META_START]), int(rec[Col.META_LEN])).tobytes()
    if _SAMPLED_KEY not in raw:
        return turn
    where = f"trajectory {entry.trajectory_id!r} event {turn.event_index}"
    data = codec.loads(raw, where).get("llm", {}).get("decoding", {})
    decoding = codec.from_json(DecodingParams, data, f"{where}.llm.decoding")
    return sampled_call(turn, decoding, where)


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
        arrays = _llm_arrays(rec, fetched, previous_context, f"{where} event {len(events)}")
        if arrays is not None:
            previous_context = np.concatenate([arrays.input_ids, arrays.output_ids])
        events.append(codec.event_from_json(data, arrays, f"{where}.events[{len(events)}]"))
    outcome = None
    if entry.closed:
        rec = records[entry.close_row]
        payload = meta.get(int(rec[Col.META_START]), int(rec[Col.META_LEN])).tobytes()
        outcome = codec.from_json(Outcome, codec.loads(payload, f"{where} outcome"), "outcome")
    return Trajectory(
        header=entry.header, events=tuple(events), outcome=outcome, annotations=entry.annotations
    )
