"""The single writer of a tenant partition: redact, encode, append, commit durably.

Two ways in, both durable on return:
- `append(trajectories)`: whole trajectories (header, events, outcome, annotations) in one
  commit; what the rollout loop uses.
- sessions: `open_trajectory(header)` then `session.append_event(...)` as events happen and
  `session.close(outcome)`; each call returns only after its records are committed, so every
  acknowledged event survives a crash. What the serving data proxy uses.

Calls may come from many threads. Records are staged under a short lock (positions assigned,
bytes encoded) and committed by whichever caller takes the commit lock next, which commits
everything staged so far in one TensorStore transaction and one head write ("group commit"):
concurrent sessions share the cost of each durable commit.

Commit protocol: write data past the committed lengths in one transaction, commit it, then
replace `head.json` with a compare-and-swap on its storage generation. One writer per partition:
an advisory lock on local files, and on any kvstore the head's compare-and-swap fences a writer
whose partition was taken over (its next commit fails with `WriterFencedError`).
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np
import tensorstore as ts

from atdp_io import encoding, layout, lineage
from atdp_io.governance import is_expired
from atdp_io.index import PartitionIndex
from atdp_io.layout import Head
from atdp_io.locking import acquire_writer_lock, release_writer_lock
from atdp_io.reader import read_head, sync_index
from atdp_io.redaction import Redactor
from atdp_io.schema import (
    Annotation,
    Event,
    LateReward,
    Outcome,
    Reward,
    SchemaError,
    Trajectory,
    TrajectoryHeader,
)
from atdp_io.session import TrajectorySession

_WRITER_CACHE_BYTES = 64 << 20  # keeps tail chunks cached so small commits skip re-reading them


class WriterError(RuntimeError):
    """The writer cannot continue (lost its partition, or an I/O failure left it unusable)."""


class WriterFencedError(WriterError):
    """Another writer took over this partition; this one must stop."""


@dataclasses.dataclass
class _TrajState:
    row: int
    n_events: int
    closed: bool
    last_context: np.ndarray | None = None  # the previous LLM call's input + output


@dataclasses.dataclass
class _Staged:
    """Records staged for commit; contiguous with the previous staged batch in every array."""

    records: list[tuple[int, ...]] = dataclasses.field(default_factory=list)
    meta: list[bytes] = dataclasses.field(default_factory=list)
    streams: dict[str, list[np.ndarray]] = dataclasses.field(
        default_factory=lambda: {name: [] for name in layout.TOKEN_STREAMS}
    )


class PartitionWriter:
    """Appends to one tenant partition (construct through `AtdpStore.writer`)."""

    def __init__(
        self,
        partition: Mapping[str, Any],
        tenant: str,
        config: layout.StoreConfig,
        *,
        redactor: Redactor | None = None,
        clock: Callable[[], float] = time.time,
        context: ts.Context | None = None,
    ):
        self.tenant = tenant
        self._partition = dict(partition)
        self._redactor = redactor or Redactor()
        self._clock = clock
        self._lock_file = acquire_writer_lock(self._partition, tenant)
        try:
            cache = {"cache_pool": {"total_bytes_limit": _WRITER_CACHE_BYTES}}
            context = ts.Context(cache, parent=context or ts.Context())
            self._arrays = layout.open_arrays(self._partition, config, create=True, context=context)
            self._kvstore = ts.KvStore.open(self._partition, context=context).result()
            self._take_over()
        except BaseException:
            release_writer_lock(self._lock_file)
            raise
        self._state_lock = threading.Lock()
        self._commit_lock = threading.Lock()
        self._pending = _Staged()
        self._staged_ticket = 0
        self._durable_ticket = 0
        self._failure: BaseException | None = None
        self._closed = False
        self._committer: ThreadPoolExecutor | None = None
        self._in_flight: list[Future] = []
        self.stats = {"commits": 0, "records": 0, "tokens": 0, "redaction_findings": 0}

    # ---------------------------------------------------------------- public API

    def append(self, trajectories: Iterable[Trajectory]) -> list[str]:
        """Writes whole trajectories in one durable commit; returns their ids.

        A trajectory without an outcome stays open (resume it with `resume`). Its annotations
        are written as late records after its events.
        """
        ids, ticket = self._stage_trajectories(trajectories)
        self._commit_through(ticket)
        return ids

    def append_async(self, trajectories: Iterable[Trajectory]) -> Future[list[str]]:
        """`append` that returns once the trajectories are validated and staged.

        The future resolves to their ids when they are durable (or raises the commit's error).
        Commits run on one background thread, so the caller prepares its next batch while the
        previous one is on its way to disk, and batches staged meanwhile share one commit.
        """
        ids, ticket = self._stage_trajectories(trajectories)
        with self._state_lock:
            if self._committer is None:
                self._committer = ThreadPoolExecutor(1, thread_name_prefix="atdp-commit")
            future = self._committer.submit(self._commit_through, ticket)
            self._in_flight.append(future)
        return _chain(future, ids)

    def flush(self) -> None:
        """Waits until every `append_async` so far is durable; raises the first failure."""
        with self._state_lock:
            in_flight, self._in_flight = self._in_flight, []
        for future in in_flight:
            future.result()

    def open_trajectory(self, header: TrajectoryHeader) -> TrajectorySession:
        """Starts an incremental trajectory; its header is durable when this returns."""
        header = self._redact_header(header)
        with self._state_lock:
            self._check_usable()
            self._check_new(header, set())
            self._stage_open(header)
            ticket = self._staged_ticket
        self._commit_through(ticket)
        return TrajectorySession(self, header.trajectory_id)

    def resume(self, trajectory_id: str) -> TrajectorySession:
        """A session for an open trajectory written before (e.g. before a restart)."""
        with self._state_lock:
            state = self._state(trajectory_id)
            if state.closed:
                raise WriterError(f"trajectory {trajectory_id!r} is closed; it cannot be resumed")
        return TrajectorySession(self, trajectory_id)

    def append_events(self, trajectory_id: str, events: Sequence[Event]) -> list[int]:
        """Appends events to an open trajectory; durable on return. Returns their indices."""
        redacted = [self._redact_event(e) for e in events]
        with self._state_lock:
            self._check_usable()
            state = self._open_state(trajectory_id)
            indices = [self._stage_event(state, event) for event in redacted]
            ticket = self._staged_ticket
        self._commit_through(ticket)
        return indices

    def close_trajectory(self, trajectory_id: str, outcome: Outcome) -> None:
        """Marks a trajectory complete (loadable for training); durable on return."""
        if not isinstance(outcome, Outcome):
            raise SchemaError("outcome: expected Outcome")
        with self._state_lock:
            self._check_usable()
            self._stage_close(self._open_state(trajectory_id), outcome)
            ticket = self._staged_ticket
        self._commit_through(ticket)

    def annotate(self, *annotations: Annotation) -> None:
        """Appends late-bound records (rewards, verdicts, critiques, governance updates)."""
        redacted = [self._redactor.redact_annotation(a) for a in annotations]
        with self._state_lock:
            self._check_usable()
            for note in redacted:  # all or nothing: check before staging
                _check_event_index(note, self._state(note.trajectory_id).n_events)
            for note in redacted:
                self._stage_annotation(note)
            ticket = self._staged_ticket
        self._commit_through(ticket)

    def add_reward(
        self,
        trajectory_id: str,
        value: float,
        *,
        event_index: int | None = None,
        source: str = "late",
    ) -> None:
        """A late reward for an event (None: the trajectory's last LLM call)."""
        self.annotate(
            LateReward(trajectory_id, event_index, Reward(float(value), source), self._clock())
        )

    def purge(self, trajectory_ids: Iterable[str], *, reason: str) -> list[str]:
        """Erases trajectories (deletion request or retention); returns the ids purged.

        Tombstones are committed first, so readers stop serving the trajectories, then every byte
        of their records (JSON payloads and token streams) is overwritten with zeros.
        """
        ids = list(dict.fromkeys(trajectory_ids))
        if not ids:
            return []
        with self._commit_lock:
            index = self._synced_index()
            missing = [i for i in ids if i not in index.by_id]
            if missing:
                raise WriterError(f"purge: {missing} are not committed in {self.tenant!r}")
            rows = [index.by_id[i].row for i in ids]
        now = self._clock()
        with self._state_lock:
            self._check_usable()
            for trajectory_id, row in zip(ids, rows, strict=True):
                self._stage(encoding.encode_purge(row, reason, now))
                self._states.pop(trajectory_id, None)  # no more appends or annotations
            ticket = self._staged_ticket
        self._commit_through(ticket)
        with self._commit_lock:
            index = self._synced_index()
            erased = np.concatenate([index.records[_rows_of(index.by_row[row])] for row in rows])
            layout.erase_records(self._arrays, erased)
        return ids

    def expired_ids(self, now: float | None = None) -> list[str]:
        """Ids of the trajectories whose (effective) retention expired at `now`."""
        now = self._clock() if now is None else now
        with self._commit_lock:
            index = self._synced_index()
            return [
                e.trajectory_id for e in index.by_id.values() if is_expired(e.governance(), now)
            ]

    def purge_expired(self, now: float | None = None) -> list[str]:
        """Purges every trajectory whose (effective) retention expired at `now`, and what this
        partition derived from them (`lineage`); `AtdpStore.purge_expired` also reaches records
        derived into other partitions."""
        expired = self.expired_ids(now)
        if not expired:
            return []
        with self._commit_lock:
            derived = lineage.in_partition_descendants(self._synced_index(), self.tenant, expired)
        return self.purge(derived + expired, reason="retention expired")

    def close(self) -> None:
        """Waits for asynchronous appends, then releases the partition lock."""
        if self._closed:
            return
        try:
            self.flush()
        finally:
            self._closed = True
            if self._committer is not None:
                self._committer.shutdown(wait=True)
            release_writer_lock(self._lock_file)

    def __enter__(self) -> PartitionWriter:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ---------------------------------------------------------------- startup

    def _take_over(self) -> None:
        head, generation = read_head(self._kvstore, self.tenant)
        if head is None:
            head, generation = Head(tenant=self.tenant), layout.MISSING_GENERATION
        elif head.tenant != self.tenant:
            raise WriterError(f"partition holds tenant {head.tenant!r}, not {self.tenant!r}")
        self._index = PartitionIndex()
        sync_index(self._index, self._arrays, head)
        self._states = {
            e.trajectory_id: _TrajState(e.row, e.n_events, e.closed)
            for e in self._index.by_id.values()
        }
        self._head = dataclasses.replace(head, writer_epoch=head.writer_epoch + 1)
        self._head_generation = self._write_head(self._head, generation)
        self._next = {"records": head.records, "tokens": head.tokens, "meta": head.meta_bytes}

    def _synced_index(self) -> PartitionIndex:
        sync_index(self._index, self._arrays, self._head)
        return self._index

    # ---------------------------------------------------------------- staging (under state lock)

    def _check_usable(self) -> None:
        if self._closed:
            raise WriterError(f"writer for {self.tenant!r} is closed")
        if self._failure is not None:
            raise WriterError(
                f"writer for {self.tenant!r} failed earlier ({self._failure!r}); reopen it"
            ) from self._failure

    def _state(self, trajectory_id: str) -> _TrajState:
        state = self._states.get(trajectory_id)
        if state is None:
            raise WriterError(f"trajectory {trajectory_id!r} is not in partition {self.tenant!r}")
        return state

    def _open_state(self, trajectory_id: str) -> _TrajState:
        state = self._state(trajectory_id)
        if state.closed:
            raise WriterError(f"trajectory {trajectory_id!r} is closed (or purged)")
        return state

    def _stage_trajectories(self, trajectories: Iterable[Trajectory]) -> tuple[list[str], int]:
        """Redacts and serializes outside the lock, then stages; returns (ids, ticket)."""
        prepared = []
        for traj in trajectories:
            if not isinstance(traj, Trajectory):
                raise SchemaError(f"append: expected Trajectory, got {type(traj).__name__}")
            header = self._redact_header(traj.header)
            events = [self._redact_event(e) for e in traj.events]
            notes = [self._redactor.redact_annotation(a) for a in traj.annotations]
            prepared.append((header, events, traj.outcome, notes))
        with self._state_lock:
            self._check_usable()
            seen: set[str] = set()
            for header, events, _, notes in prepared:  # all or nothing: check before staging
                self._check_new(header, seen)
                for note in notes:
                    _check_event_index(note, len(events))
            ids = [self._stage_trajectory(*item) for item in prepared]
            return ids, self._staged_ticket

    def _stage_trajectory(self, header, events, outcome, notes) -> str:
        state = self._stage_open(header)
        for event in events:
            self._stage_event(state, event)
        if outcome is not None:
            self._stage_close(state, outcome)
        for note in notes:
            self._stage_annotation(note)
        return header.trajectory_id

    def _check_new(self, header: TrajectoryHeader, seen: set[str]) -> None:
        if header.governance.tenant != self.tenant:
            raise SchemaError(
                f"header.governance.tenant: {header.governance.tenant!r} does not match the "
                f"partition {self.tenant!r}"
            )
        if header.trajectory_id in self._states or header.trajectory_id in seen:
            raise SchemaError(f"header.trajectory_id: {header.trajectory_id!r} already exists")
        seen.add(header.trajectory_id)

    def _stage_open(self, header: TrajectoryHeader) -> _TrajState:
        state = _TrajState(row=self._next["records"], n_events=0, closed=False)
        self._stage(encoding.encode_open(header, state.row))
        self._states[header.trajectory_id] = state
        return state

    def _stage_event(self, state: _TrajState, event: encoding.PreparedEvent) -> int:
        index = state.n_events
        record, state.last_context = encoding.encode_event(
            event, state.row, index, state.last_context
        )
        self._stage(record)
        state.n_events += 1
        return index

    def _stage_close(self, state: _TrajState, outcome: Outcome) -> None:
        self._stage(encoding.encode_close(outcome, state.row))
        state.closed = True
        state.last_context = None  # only open trajectories need it; contexts can be large

    def _stage_annotation(self, note: Annotation) -> None:
        self._stage(encoding.encode_annotation(note, self._state(note.trajectory_id).row))

    def _stage(self, record: encoding.EncodedRecord) -> None:
        """Queues a record at the next free positions of every array."""
        self._pending.records.append(record.row(self._next["tokens"], self._next["meta"]))
        self._pending.meta.append(record.meta)
        if record.streams is not None:
            for name in layout.TOKEN_STREAMS:
                self._pending.streams[name].extend(record.streams[name])
            self._next["tokens"] += record.n_tokens
        self._next["records"] += 1
        self._next["meta"] += len(record.meta)
        self._staged_ticket += 1

    # ---------------------------------------------------------------- committing

    def _commit_through(self, ticket: int) -> None:
        """Returns once everything staged up to `ticket` is durable (group commit)."""
        with self._commit_lock:
            if self._durable_ticket >= ticket:
                return
            with self._state_lock:
                self._check_usable()
                staged, self._pending = self._pending, _Staged()
                last_ticket = self._staged_ticket
                new_lengths = dict(self._next)
            try:
                self._write_staged(staged, new_lengths)
            except BaseException as err:
                self._failure = err
                raise
            self._durable_ticket = last_ticket

    def _write_staged(self, staged: _Staged, new_lengths: dict[str, int]) -> None:
        head = self._head
        if self._lock_file is None:
            # No file lock on remote kvstores: detect a takeover before touching data, so a
            # fenced writer cannot overwrite what the new writer committed (except in the short
            # window between this check and the data write).
            _, generation = read_head(self._kvstore, self.tenant)
            if generation != self._head_generation:
                raise WriterFencedError(
                    f"partition {self.tenant!r} was taken over by another writer; stop this one"
                )
        records = np.array(staged.records, np.int64)
        meta = np.frombuffer(b"".join(staged.meta), np.uint8)
        streams = {n: np.concatenate(p) for n, p in staged.streams.items() if p}
        layout.write_tail(self._arrays, head, records, meta, streams)
        n_tokens = streams["tokens"].shape[0] if streams else 0
        new_head = dataclasses.replace(
            head,
            records=new_lengths["records"],
            tokens=new_lengths["tokens"],
            meta_bytes=new_lengths["meta"],
            commits=head.commits + 1,
        )
        if (new_head.records, new_head.tokens, new_head.meta_bytes) != (
            head.records + records.shape[0],
            head.tokens + n_tokens,
            head.meta_bytes + meta.shape[0],
        ):
            raise WriterError("internal error: staged lengths disagree with the staged data")
        self._head_generation = self._write_head(new_head, self._head_generation)
        self._head = new_head
        self.stats["commits"] += 1
        self.stats["records"] += records.shape[0]
        self.stats["tokens"] += n_tokens

    def _write_head(self, head: Head, expected_generation: bytes) -> bytes:
        stamp = self._kvstore.write("head.json", head.to_bytes(), if_equal=expected_generation)
        generation = stamp.result().generation
        if not generation:
            raise WriterFencedError(
                f"partition {self.tenant!r} was taken over by another writer; stop this one"
            )
        return generation

    # ---------------------------------------------------------------- redaction

    def _redact_header(self, header: TrajectoryHeader) -> TrajectoryHeader:
        if not isinstance(header, TrajectoryHeader):
            raise SchemaError("header: expected TrajectoryHeader")
        return self._redactor.redact_header(header)

    def _redact_event(self, event: Event) -> encoding.PreparedEvent:
        if not isinstance(event, Event):
            raise SchemaError(f"event: expected Event, got {type(event).__name__}")
        prepared, report = encoding.prepare_event(event, self._redactor)
        if report.findings:
            with self._state_lock:
                self.stats["redaction_findings"] += sum(report.findings.values())
        return prepared


def _check_event_index(note: Annotation, n_events: int) -> None:
    event_index = getattr(note, "event_index", None)
    if event_index is not None and event_index >= n_events:
        raise SchemaError(
            f"{type(note).__name__}.event_index: {event_index} is past the last event "
            f"({n_events} events) of {note.trajectory_id!r}"
        )


def _chain(future: Future, ids: list[str]) -> Future[list[str]]:
    """A future of `ids` that resolves (or fails) with `future`."""
    out: Future[list[str]] = Future()

    def done(finished: Future) -> None:
        error = finished.exception()
        if error is None:
            out.set_result(ids)
        else:
            out.set_exception(error)

    future.add_done_callback(done)
    return out


def _rows_of(entry) -> list[int]:
    rows = [entry.row, *entry.event_rows, *entry.annotation_rows]
    return rows + ([entry.close_row] if entry.closed else [])
