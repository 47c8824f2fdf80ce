"""Grain loaders over committed ATDP trajectories, yielding fixed-shape training batches.

Two sources, one batcher:
- `AtdpLoader.epoch(...)`: a finite (or repeated) pass over the trajectories committed when the
  call is made; shuffled with a seed, sharded per host before shuffling, a `grain.MapDataset`.
- `AtdpLoader.stream(...)`: the online feed for asynchronous RL: every trajectory closed after the
  stream's cursor, in commit order, polling storage for new commits; blocks until data arrives.

Both end in `TrajectoryBatcher`, which lays trajectories out as rows (see rows.py), applies the
staleness filter with the learner's current version read at batch time, and fills batches of
`rows` rows without ever splitting a trajectory across batches. Every stage's iterator is
checkpointable (`get_state` / `set_state`), so a learner restores its data position with its
weights. Governance is enforced at read time: a trajectory that is ineligible, withheld by
consent, expired, purged or unreadable for the principal never reaches a batch.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import grain
import numpy as np

from atdp_io import rows as rows_lib
from atdp_io.governance import EligibilityPolicy, ineligibility_reason
from atdp_io.index import TrajectoryEntry
from atdp_io.reader import PartitionReader
from atdp_io.schema import SchemaError
from atdp_io.store import AtdpStore


@dataclasses.dataclass(frozen=True)
class LoaderConfig:
    """Batch geometry and filters.

    `rows` x `seq_len` is the batch shape. `too_long`: "drop" (counted) or "error" for a
    trajectory with a row longer than `seq_len` or more rows than `rows`. `max_staleness`: keep
    rows whose oldest output token is at most this many versions behind the learner (None: off);
    `staleness_unit`: drop stale "row"s or whole "trajectory"s. `reward_weights`: per-source
    weights (None sums every source).
    """

    rows: int
    seq_len: int
    layout: str = "concat"
    concat_fallback: str = "windowed"
    too_long: str = "drop"
    max_staleness: int | None = None
    staleness_unit: str = "row"
    reward_weights: Mapping[str, float] | None = None
    pad_id: int = 0
    drop_remainder: bool = False
    eligibility: EligibilityPolicy = dataclasses.field(default_factory=EligibilityPolicy)

    def __post_init__(self):
        if self.rows < 1 or self.seq_len < 1:
            raise ValueError(
                f"LoaderConfig: rows and seq_len must be >= 1, got {self.rows}, {self.seq_len}"
            )
        if self.layout not in rows_lib.LAYOUTS:
            raise ValueError(f"LoaderConfig.layout must be one of {rows_lib.LAYOUTS}")
        if self.too_long not in ("drop", "error"):
            raise ValueError("LoaderConfig.too_long must be 'drop' or 'error'")
        if self.staleness_unit not in ("row", "trajectory"):
            raise ValueError("LoaderConfig.staleness_unit must be 'row' or 'trajectory'")
        if self.max_staleness is not None and self.max_staleness < 0:
            raise ValueError("LoaderConfig.max_staleness must be >= 0 or None")


@dataclasses.dataclass(frozen=True, eq=False)
class TrajectoryRows:
    """One trajectory laid out as rows, as it flows from a source to the batcher."""

    tenant: str
    trajectory_id: str
    rows: list[rows_lib.Row]


class LoaderStats:
    """Thread-safe counters of what the loader read, emitted and dropped (and why)."""

    def __init__(self):
        self._lock = threading.Lock()
        self._counts: Counter = Counter()

    def add(self, key: str, n: int = 1) -> None:
        with self._lock:
            self._counts[key] += n

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return dict(self._counts)


class AtdpLoader:
    """Builds grain datasets over the partitions of `tenants`, read as `principal`.

    `current_version()` returns the learner's policy version (read at batch time for the
    staleness filter); `clock()` gives the time for retention checks.
    """

    def __init__(
        self,
        store: AtdpStore,
        tenants: Sequence[str],
        *,
        principal: str,
        config: LoaderConfig,
        current_version: Callable[[], int] = lambda: 0,
        clock: Callable[[], float] = time.time,
    ):
        if not tenants:
            raise ValueError("AtdpLoader: give at least one tenant")
        self.config = config
        self.stats = LoaderStats()
        self._current_version = current_version
        self._clock = clock
        # Opening a reader checks (and audits) the principal's right to each partition up front.
        self._readers = {
            t: store.reader(t, principal=principal, purpose="training") for t in sorted(tenants)
        }
        self._read_lock = threading.Lock()

    # ---------------------------------------------------------------- datasets

    def epoch(
        self,
        *,
        seed: int = 0,
        shuffle: bool = True,
        num_epochs: int | None = 1,
        shard: grain.sharding.ShardOptions | None = None,
        read_threads: int = 4,
    ) -> grain.IterDataset:
        """Batches over the trajectories committed now; `num_epochs` None repeats forever.

        `shard` defaults to one shard per JAX process (`jax.process_index()` of
        `jax.process_count()`); every host must use the same `seed`.
        """
        shard = shard or _jax_process_shard()
        snapshot = self._snapshot()
        self.stats.add("epoch_trajectories", len(snapshot))
        ds = grain.MapDataset.source(snapshot)
        ds = ds[shard.shard_index :: shard.shard_count]
        if shuffle:
            ds = ds.shuffle(seed)
        if num_epochs != 1:
            ds = ds.repeat(num_epochs)
        ds = ds.map(self._load)
        options = grain.ReadOptions(num_threads=read_threads, prefetch_buffer_size=2 * read_threads)
        return TrajectoryBatcher(ds.to_iter_dataset(options), self)

    def stream(
        self,
        *,
        poll_interval_s: float = 0.5,
        idle_timeout_s: float | None = None,
        shard: grain.sharding.ShardOptions | None = None,
    ) -> grain.IterDataset:
        """Batches of trajectories closed after the cursor, waiting for new commits.

        Without `idle_timeout_s` a `next()` blocks until a batch fills; with it, the stream
        emits a last partial batch and ends after that long without a new trajectory.
        """
        shard = shard or _jax_process_shard()
        source = StreamSource(self, shard, poll_interval_s, idle_timeout_s)
        return TrajectoryBatcher(source, self)

    # ---------------------------------------------------------------- reading

    def _snapshot(self) -> list[tuple[str, int]]:
        """(tenant, trajectory row) of every closed trajectory, in commit order per tenant."""
        out = []
        with self._read_lock:
            for tenant, reader in self._readers.items():
                reader.refresh()
                out.extend((tenant, row) for row in reader.index.close_order)
        return out

    def _load(self, key: tuple[str, int]) -> TrajectoryRows | None:
        """Reads one trajectory and lays it out; None (counted) when it must not train."""
        tenant, row = key
        reader = self._readers[tenant]
        entry = reader.index.by_row.get(row)
        if entry is None or entry.purged:
            self.stats.add("dropped_purged")
            return None
        reason = ineligibility_reason(
            entry.governance(),
            entry.redaction(reader.index.records),
            self._clock(),
            self.config.eligibility,
        )
        if reason is not None:  # decided from the index: ineligible bytes are never even read
            self.stats.add(f"dropped_ineligible_{reason}")
            return None
        try:
            trajectory = reader.read_entries([entry])[0]
        except SchemaError:
            if self._purged_meanwhile(reader, entry):
                return None
            raise
        layout, fallback = self.config.layout, self.config.concat_fallback
        rows, fell_back = rows_lib.trajectory_rows(
            trajectory, layout, reward_weights=self.config.reward_weights, concat_fallback=fallback
        )
        if fell_back:
            self.stats.add("concat_fallbacks")
        if not rows:
            self.stats.add("dropped_no_llm_calls")
            return None
        self.stats.add("trajectories_read")
        return TrajectoryRows(tenant, entry.trajectory_id, rows)

    def _purged_meanwhile(self, reader: PartitionReader, entry: TrajectoryEntry) -> bool:
        # A purge erases bytes after committing its tombstone: a read racing it sees zeros.
        with self._read_lock:
            reader.refresh()
        if entry.purged:
            self.stats.add("dropped_purged")
            return True
        return False


class TrajectoryBatcher(grain.IterDataset):
    """Groups `TrajectoryRows` into fixed-shape batches; never splits a trajectory."""

    def __init__(self, parent: grain.IterDataset, loader: AtdpLoader):
        super().__init__(parent)
        self._loader = loader

    def __iter__(self) -> _BatcherIterator:
        return _BatcherIterator(self._parent.__iter__(), self._loader)


class _BatcherIterator(grain.DatasetIterator):
    def __init__(self, parent: grain.DatasetIterator, loader: AtdpLoader):
        super().__init__(parent)
        self._loader = loader
        self._carry: list[rows_lib.Row] | None = None
        self._state_before_carry: dict | None = None
        self._exhausted = False

    def __next__(self) -> dict[str, np.ndarray]:
        config, stats = self._loader.config, self._loader.stats
        groups: list[list[rows_lib.Row]] = []
        used = 0
        if self._carry is not None:
            groups.append(self._carry)
            used = len(self._carry)
            self._carry = self._state_before_carry = None
        while not self._exhausted:
            state_before = self._parent.get_state()
            try:
                item = next(self._parent)
            except StopIteration:
                self._exhausted = True
                break
            rows = self._filter(item)
            if not rows:
                continue
            if used + len(rows) > config.rows:
                self._carry, self._state_before_carry = rows, state_before
                break
            groups.append(rows)
            used += len(rows)
            if used == config.rows:
                break
        if not groups or (config.drop_remainder and used < config.rows and self._exhausted):
            raise StopIteration
        stats.add("batches")
        stats.add("rows_emitted", used)
        return rows_lib.pack_batch(groups, config.rows, config.seq_len, config.pad_id)

    def _filter(self, item: TrajectoryRows) -> list[rows_lib.Row]:
        config, stats = self._loader.config, self._loader.stats
        rows = item.rows
        too_long = [r.length for r in rows if r.length > config.seq_len]
        if too_long or len(rows) > config.rows:
            if config.too_long == "error":
                raise ValueError(
                    f"trajectory {item.trajectory_id!r} ({item.tenant}) needs {len(rows)} rows of "
                    f"up to {max(r.length for r in rows)} tokens; the batch is "
                    f"{config.rows} x {config.seq_len}"
                )
            stats.add("dropped_too_long")
            return []
        if config.max_staleness is None:
            return rows
        oldest = self._loader._current_version() - config.max_staleness
        fresh = [r for r in rows if r.min_version() < 0 or r.min_version() >= oldest]
        if len(fresh) < len(rows):
            if config.staleness_unit == "trajectory":
                stats.add("dropped_stale_rows", len(rows))
                return []
            stats.add("dropped_stale_rows", len(rows) - len(fresh))
        return fresh

    def get_state(self) -> dict[str, Any]:
        # A carried trajectory is re-read after a restore: the state is the parent's before it.
        parent = self._state_before_carry if self._carry is not None else self._parent.get_state()
        return {"parent": parent}

    def set_state(self, state: dict[str, Any]) -> None:
        self._parent.set_state(state["parent"])
        self._carry = self._state_before_carry = None
        self._exhausted = False  # a stream that went idle may have new data after a restore


class StreamSource(grain.IterDataset):
    """Trajectories closed after a per-tenant cursor, in commit order, polling for more."""

    def __init__(
        self,
        loader: AtdpLoader,
        shard: grain.sharding.ShardOptions,
        poll_interval_s: float,
        idle_timeout_s: float | None,
    ):
        super().__init__()
        self._loader = loader
        self._shard = shard
        self._poll_interval_s = poll_interval_s
        self._idle_timeout_s = idle_timeout_s

    def __iter__(self) -> _StreamIterator:
        return _StreamIterator(self)


class _StreamIterator(grain.DatasetIterator):
    def __init__(self, source: StreamSource):
        super().__init__()
        self._source = source
        self._cursors = dict.fromkeys(source._loader._readers, 0)

    def __next__(self) -> TrajectoryRows:
        source, loader = self._source, self._source._loader
        idle_since = time.monotonic()
        while True:
            for tenant, reader in loader._readers.items():
                order = reader.index.close_order
                while self._cursors[tenant] < len(order):
                    row = order[self._cursors[tenant]]
                    self._cursors[tenant] += 1
                    if row % source._shard.shard_count != source._shard.shard_index:
                        continue
                    item = loader._load((tenant, row))
                    if item is not None:
                        return item
            waited = time.monotonic() - idle_since
            if source._idle_timeout_s is not None and waited >= source._idle_timeout_s:
                raise StopIteration
            if not self._refresh():
                time.sleep(source._poll_interval_s)

    def _refresh(self) -> bool:
        """Reads new commits of every partition; True when a trajectory was closed."""
        loader = self._source._loader
        with loader._read_lock:
            return any([bool(reader.refresh()) for reader in loader._readers.values()])

    def get_state(self) -> dict[str, Any]:
        return {"cursors": dict(self._cursors)}

    def set_state(self, state: dict[str, Any]) -> None:
        cursors = state["cursors"]
        if set(cursors) != set(self._cursors):
            raise ValueError(
                f"stream state is for tenants {sorted(cursors)}, this stream reads "
                f"{sorted(self._cursors)}"
            )
        self._refresh()
        self._cursors = {t: int(c) for t, c in cursors.items()}


def _jax_process_shard() -> grain.sharding.ShardOptions:
    import jax  # lazily: the CLI and writers never need it

    return grain.sharding.ShardOptions(
        shard_index=jax.process_index(), shard_count=jax.process_count()
    )
