"""Grain loaders over committed ATDP trajectories, yielding fixed-shape training batches.

Two sources, one batcher (see pipeline.py):
- `AtdpLoader.epoch(...)`: a finite (or repeated) pass over the trajectories committed when the
  call is made; sharded per host, then shuffled with a seed: a `grain.MapDataset` underneath.
- `AtdpLoader.stream(...)`: the online feed for asynchronous RL: every trajectory closed after
  the stream's cursor, in commit order, polling storage for new commits; blocks until data.

Trajectories are read in groups (one TensorStore batch per group), laid out as rows (rows.py)
and packed into `[rows, seq_len]` batches without ever splitting a trajectory, nor, with
`LoaderConfig.group_by`, a group of trajectories committed together (groups.py). Iterators are
checkpointable (`get_state` / `set_state`). Calls sampled under a token mask (forced tool
calls, JSON output, thinking budgets) need the loader's `mask_replay` to rebuild their masks;
a trajectory whose masks do not replay is skipped (logged, counted), the others load.
Governance is enforced at read time from the index:
an ineligible, consent-withdrawn, expired or purged trajectory is never even read (the training
readers underneath refuse one anyway), and a batch is re-checked against purges, expiry and
governance updates just before it leaves.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import grain

from atdp_io import groups as groups_lib
from atdp_io import rows as rows_lib
from atdp_io.governance import IneligibleTrajectoryError, ineligibility_reason
from atdp_io.loader_config import LoaderConfig as LoaderConfig  # the loader's public API
from atdp_io.loader_config import LoaderStats
from atdp_io.pipeline import LoaderStarvedError as LoaderStarvedError  # the iterators raise it
from atdp_io.pipeline import ReadGroup, StreamSource, TrajectoryBatcher, TrajectoryRows
from atdp_io.schema import SchemaError
from atdp_io.store import AtdpStore
from atdp_io.token_masks import ConstraintReplayError

if TYPE_CHECKING:  # llguidance is imported only by a loader that replays masks
    from atdp_io.mask_replay import MaskReplay

logger = logging.getLogger(__name__)


class AtdpLoader:
    """Builds grain datasets over the partitions of `tenants`, read as `principal`.

    `current_version()` returns the learner's policy version (read at batch time for the
    staleness filter); `clock()` gives the time for retention checks. `shard`: the default
    shard of `epoch` / `stream` (None: one per JAX process; `ShardOptions(0, 1)` reads every
    trajectory, e.g. when each process of a job reads a tenant of its own).
    `mask_replay`: an `atdp_io.mask_replay.MaskReplay` (the served tokenizer and the
    model's vocabulary size) that rebuilds the masks of calls sampled under a grammar or a
    thinking budget, so they train with the exact masked ratio; without one such a call
    raises a ValueError naming it. A trajectory whose recorded masks do not replay over its
    tokens is skipped (counted as `dropped_bad_constraint`, the error naming the call
    logged); it stays stored.
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
        shard: grain.sharding.ShardOptions | None = None,
        mask_replay: MaskReplay | None = None,
    ):
        if not tenants:
            raise ValueError("AtdpLoader: give at least one tenant")
        self.config = config
        self.stats = LoaderStats()
        self.current_version = current_version
        self._clock = clock
        self._shard = shard
        self.mask_replay = mask_replay
        # Opening a reader checks (and audits) the principal's right to each partition up front.
        self.readers = {
            t: store.reader(
                t, principal=principal, purpose="training", eligibility=config.eligibility
            )
            for t in sorted(tenants)
        }
        self._read_lock = threading.Lock()

    def epoch(
        self,
        *,
        seed: int = 0,
        shuffle: bool = True,
        num_epochs: int | None = 1,
        shard: grain.sharding.ShardOptions | None = None,
        read_threads: int = 2,
        read_group: int | None = None,
    ) -> grain.IterDataset:
        """Batches over the trajectories committed now; `num_epochs` None repeats forever.

        `shard` defaults to the loader's (its constructor's `shard`; when that is None too, one
        shard per JAX process: `jax.process_index()` of `jax.process_count()`); every host must
        use the same `seed`. Trajectories are read `read_group` at a time (default: `rows`) on
        `read_threads` threads. With `num_epochs` None, a whole pass in which every trajectory
        is dropped (too long, stale, ineligible) raises `LoaderStarvedError` instead of
        repeating forever. With `config.group_by`, whole groups are sharded and shuffled, and
        read about `read_group` trajectories' worth of groups at a time.
        """
        shard = shard or self._shard or _jax_process_shard()
        if self.config.group_by is None:
            snapshot = self._snapshot()
            self.stats.add("epoch_trajectories", len(snapshot))
            ds = grain.MapDataset.source(snapshot)
            ds = ds[shard.shard_index :: shard.shard_count]
            pass_size = len(ds) if num_epochs is None else None
            per_read = read_group or self.config.rows
        else:
            units = self._snapshot_groups()
            self.stats.add("epoch_trajectories", sum(len(unit) for unit in units))
            mine = units[shard.shard_index :: shard.shard_count]
            keys = sum(len(unit) for unit in mine)
            pass_size = keys if num_epochs is None else None
            per_read = max(1, round((read_group or self.config.rows) * len(mine) / max(keys, 1)))
            ds = grain.MapDataset.source(mine)
        if shuffle:
            ds = ds.shuffle(seed)
        if num_epochs != 1:
            ds = ds.repeat(num_epochs)
        ds = ds.batch(per_read, batch_fn=list)
        ds = ds.map(self._read_group)
        options = grain.ReadOptions(num_threads=read_threads, prefetch_buffer_size=2 * read_threads)
        return TrajectoryBatcher(ds.to_iter_dataset(options), self, pass_size=pass_size)

    def stream(
        self,
        *,
        poll_interval_s: float = 0.5,
        idle_timeout_s: float | None = None,
        shard: grain.sharding.ShardOptions | None = None,
        read_group: int | None = None,
    ) -> grain.IterDataset:
        """Batches of trajectories closed after the cursor, waiting for new commits.

        Without `idle_timeout_s` a `next()` blocks until a batch fills; with it, the stream
        emits a last partial batch and ends after that long without a new trajectory. `shard`:
        as for `epoch`. With `config.group_by`, a read takes whole groups (it may pass
        `read_group` to finish one) and shards deal out groups, not trajectories.
        """
        shard = shard or self._shard or _jax_process_shard()
        group = read_group or self.config.rows
        source = StreamSource(self, shard, poll_interval_s, idle_timeout_s, group)
        return TrajectoryBatcher(source, self, stream=True)

    def refresh(self) -> bool:
        """Reads new commits of every partition; True when a trajectory was closed."""
        with self._read_lock:
            return any([bool(reader.refresh()) for reader in self.readers.values()])

    def load_many(
        self,
        keys: Sequence[tuple[str, int]],
        groups: Sequence[tuple[str, int] | None] | None = None,
    ) -> list[TrajectoryRows]:
        """Reads `(tenant, trajectory row)`s (one fetch per tenant) and lays them out, in order.

        `groups[i]`: the group of `keys[i]` (the key of its first member), kept on the item.
        Trajectories that must not train are left out and counted by reason.
        """
        group_of = dict(zip(keys, groups, strict=True)) if groups is not None else {}
        now = self._clock()  # one time for the check and the read, so they cannot disagree
        eligible = [key for key in keys if self._eligible(*key, now)]
        views = {}
        for tenant in dict.fromkeys(t for t, _ in eligible):
            rows = [row for t, row in eligible if t == tenant]
            read = self._views(tenant, rows, now)
            views.update(((tenant, row), v) for row, v in zip(rows, read, strict=True))
        items = []
        for key in eligible:
            view = views.get(key)
            if view is None:
                continue  # purged while being read
            if self.mask_replay is not None:
                try:
                    view = self.mask_replay.view(view)
                except ConstraintReplayError as error:
                    self.stats.add("dropped_bad_constraint")
                    logger.warning("%s; trajectory skipped (it stays stored)", error)
                    continue
            rows, fell_back = rows_lib.trajectory_rows(
                view,
                self.config.layout,
                reward_weights=self.config.reward_weights,
                concat_fallback=self.config.concat_fallback,
            )
            self.stats.add("concat_fallbacks", int(fell_back))
            if not rows:
                self.stats.add("dropped_no_llm_calls")
                continue
            self.stats.add("trajectories_read")
            group = group_of.get(key)
            items.append(TrajectoryRows(key[0], view.trajectory_id, key[1], rows, group))
        return items

    def tenants(self) -> list[str]:
        """The tenants read, sorted."""
        return list(self.readers)

    def close_order(self, tenant: str) -> Sequence[int]:
        """Trajectory rows of `tenant`'s closed trajectories in commit order (as of the last
        `refresh`)."""
        return self.readers[tenant].index.close_order

    def group_length(self, tenant: str, position: int) -> int:
        """Trajectories in the group starting at `position` of `close_order(tenant)` (1
        without `config.group_by`)."""
        if self.config.group_by is None:
            return 1
        return groups_lib.run_length_at(self.readers[tenant].index, position, self.config.group_by)

    def has_late_reward(self, tenant: str, row: int) -> bool:
        """Whether trajectory `row` of `tenant` has a `LateReward` (as of the last `refresh`)."""
        return bool(self.readers[tenant].index.by_row[row].late_rewards())

    def still_allowed(self, items: Sequence[TrajectoryRows]) -> list[bool]:
        """Re-checks, just before a batch leaves, each item against purges and governance.

        A purge commits its tombstone before erasing bytes, so data read before this check is
        intact unless the tombstone is visible now; a consent withdrawn, a review rejection or
        an expiry since the read makes the item ineligible now. Either drops it (counted).
        """
        with self._read_lock:
            for tenant in {item.tenant for item in items}:
                self.readers[tenant].refresh()
        now = self._clock()
        return [self._eligible(item.tenant, item.row, now) for item in items]

    def _snapshot(self) -> list[tuple[str, int]]:
        """(tenant, trajectory row) of every closed trajectory, in commit order per tenant."""
        self.refresh()
        return [(t, row) for t, reader in self.readers.items() for row in reader.index.close_order]

    def _snapshot_groups(self) -> list[list[tuple[str, int]]]:
        """The closed trajectories as groups (runs of `config.group_by`), in commit order."""
        self.refresh()
        units = []
        for tenant in self.readers:
            order, position = self.close_order(tenant), 0
            while position < len(order):
                length = self.group_length(tenant, position)
                units.append([(tenant, row) for row in order[position : position + length]])
                position += length
        return units

    def _read_group(self, batch: list) -> ReadGroup:
        """Reads one list of keys (or of groups of keys) of an epoch."""
        if self.config.group_by is None:
            return ReadGroup(self.load_many(batch), num_keys=len(batch))
        keys = [key for unit in batch for key in unit]
        groups = [unit[0] for unit in batch for _ in unit]
        return ReadGroup(self.load_many(keys, groups), num_keys=len(keys))

    def _eligible(self, tenant: str, row: int, now: float) -> bool:
        index = self.readers[tenant].index
        entry = index.by_row.get(row)
        if entry is None or entry.purged:
            self.stats.add("dropped_purged")
            return False
        reason = ineligibility_reason(
            entry.governance(), entry.redaction(index.records), now, self.config.eligibility
        )
        self.stats.add(f"dropped_ineligible_{reason}", int(reason is not None))
        return reason is None

    def _views(self, tenant: str, rows: list[int], now: float) -> list:
        """Training views of `rows`, None for any purged while reading (the read races the
        erase of a purge whose tombstone this reader had not seen yet) or made ineligible by a
        governance update another thread's refresh indexed since the check."""
        reader = self.readers[tenant]
        sources = self.config.reward_weights is not None
        try:
            entries = [reader.index.by_row[row] for row in rows]
            return reader.read_training_views(entries, reward_sources=sources, now=now)
        except (SchemaError, IneligibleTrajectoryError):
            self.refresh()
            live = [row for row in rows if self._eligible(tenant, row, now)]
            entries = [reader.index.by_row[row] for row in live]
            read = reader.read_training_views(entries, reward_sources=sources, now=now)
            views = dict(zip(live, read, strict=True))
            return [views.get(row) for row in rows]


def _jax_process_shard() -> grain.sharding.ShardOptions:
    import jax  # lazily: the CLI and writers never need it

    return grain.sharding.ShardOptions(
        shard_index=jax.process_index(), shard_count=jax.process_count()
    )
