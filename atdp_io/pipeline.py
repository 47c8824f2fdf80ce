"""The grain stages behind `AtdpLoader`: the batcher and the online stream source.

Both pass lists of `TrajectoryRows` (one list per read group). The batcher's checkpoint state is
the parent's state before the list it is in plus how many items of that list were consumed, so
a restored iterator continues exactly where the saved one stood, including a trajectory carried
over to the next batch because it did not fit.

With `LoaderConfig.group_by` the unit the batcher never splits is a group (groups.py): the
sources put each group whole into one list (a read group is extended to finish one) and tag
its items with the group's first key; the batcher takes a group's items together, so a group
that does not fit the rest of a batch starts the next one, and one larger than a batch is
dropped or refused like a too-long trajectory.

A batcher never waits on data it throws away: a repeated epoch that went a whole pass without
keeping a trajectory, or a stream that dropped `LoaderConfig.starved_after` trajectories in a row
as too long, raises `LoaderStarvedError` (the epoch would otherwise spin forever, and the stream
would wait on producers that may be waiting on the learner). A finite epoch just ends.
"""

from __future__ import annotations

import collections
import dataclasses
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import grain
import numpy as np

from atdp_io import rows as rows_lib
from atdp_io import trained_on
from atdp_io.loader_config import LoaderConfig, LoaderStats


class LoaderStarvedError(ValueError):
    """Every trajectory the loader read lately was dropped, so no batch can ever fill."""


class ReadGroup(list):
    """The `TrajectoryRows` read from one group of keys, and how many keys that group had
    (those missing were ineligible, purged, without LLM calls or with masks that do not
    replay)."""

    def __init__(self, items, num_keys: int):
        super().__init__(items)
        self.num_keys = num_keys


@dataclasses.dataclass
class DropTally:
    """What the batcher dropped since it last kept a trajectory or group (for
    `LoaderStarvedError`); `too_long` counts groups under `LoaderConfig.group_by`."""

    too_long: int = 0
    stale: int = 0
    unreadable: int = 0  # ineligible, purged, without LLM calls or masks that do not replay
    longest_row: int = 0
    most_rows: int = 0

    def describe(self, rows: int, seq_len: int, unit: str = "trajectory") -> str:
        parts = []
        if self.too_long:
            parts.append(
                f"{self.too_long} too long for the {rows} x {seq_len} batch (rows of up to "
                f"{self.longest_row} tokens, up to {self.most_rows} rows per {unit})"
            )
        if self.stale:
            parts.append(f"{self.stale} stale")
        if self.unreadable:
            parts.append(
                f"{self.unreadable} ineligible, purged or without LLM calls (or with token "
                "masks that do not replay)"
            )
        advice = ""
        if self.too_long and self.longest_row > seq_len:
            advice = f"; raise seq_len to at least {self.longest_row}"
        if self.too_long and self.most_rows > rows:
            advice += f"; raise rows to at least {self.most_rows}"
        return ", ".join(parts) + advice


@dataclasses.dataclass(frozen=True, eq=False)
class TrajectoryRows:
    """One trajectory laid out as rows, as it flows from a source to the batcher."""

    tenant: str
    trajectory_id: str
    row: int  # the trajectory's row in its partition's record log
    rows: list[rows_lib.Row]
    group: tuple[str, int] | None = None  # (tenant, row) of its group's first member

    def starts_group(self) -> bool:
        return self.group is None or self.group == (self.tenant, self.row)


class TrajectoryFeed(Protocol):
    """What the stages read from their loader (`AtdpLoader`): its settings and counters, the
    commit order of each tenant, and reads and re-checks of trajectories."""

    config: LoaderConfig
    stats: LoaderStats
    current_version: Callable[[], int]  # the learner's policy version now

    def tenants(self) -> list[str]: ...

    def close_order(self, tenant: str) -> Sequence[int]:
        """Trajectory rows of the tenant's closed trajectories, in commit order."""
        ...

    def group_length(self, tenant: str, position: int) -> int:
        """Trajectories in the group starting at `position` of the close order."""
        ...

    def has_late_reward(self, tenant: str, row: int) -> bool: ...

    def refresh(self) -> bool:
        """Reads new commits; True when a trajectory was closed."""
        ...

    def load_many(
        self,
        keys: Sequence[tuple[str, int]],
        groups: Sequence[tuple[str, int] | None] | None = None,
    ) -> list[TrajectoryRows]:
        """The eligible ones of `(tenant, row)`s, laid out as rows, in order."""
        ...

    def still_allowed(self, items: Sequence[TrajectoryRows]) -> list[bool]:
        """Whether each item may still train (purges, governance), checked just now."""
        ...


class TrajectoryBatcher(grain.IterDataset):
    """Packs lists of `TrajectoryRows` into fixed-shape batches; never splits a trajectory
    (nor, with `LoaderConfig.group_by`, a group).

    `pass_size`: trajectories in one pass of a repeated epoch; a whole pass without one kept
    trajectory raises `LoaderStarvedError`. `stream`: the parent is a `StreamSource`; too-long
    drops in a row are counted against `LoaderConfig.starved_after`.
    """

    def __init__(
        self,
        parent: grain.IterDataset,
        feed: TrajectoryFeed,
        *,
        pass_size: int | None = None,
        stream: bool = False,
    ):
        super().__init__(parent)
        self._feed = feed
        self._pass_size, self._stream = pass_size, stream

    def __iter__(self) -> _BatcherIterator:
        return _BatcherIterator(self._parent.__iter__(), self._feed, self._pass_size, self._stream)


class _BatcherIterator(grain.DatasetIterator):
    def __init__(
        self,
        parent: grain.DatasetIterator,
        feed: TrajectoryFeed,
        pass_size: int | None,
        stream: bool,
    ):
        super().__init__(parent)
        self._feed = feed
        self._pass_size, self._stream = pass_size, stream
        self._dropped = DropTally()
        self._keys_read = 0  # keys pulled from the parent since the start (or a restore)
        self._last_kept_at = 0  # `_keys_read` when a trajectory was last kept
        self._aligned = True  # `_keys_read` counts from the start of a pass (not restored)
        self._unread = 0  # keys of the list in `_queue` that yielded no item
        self._queue: collections.deque[TrajectoryRows] = collections.deque()
        self._list_state: dict | None = None  # parent state before the list in `_queue`
        self._taken = 0  # items of that list already consumed
        self._carry: list[tuple[TrajectoryRows, list[rows_lib.Row]]] | None = None  # one unit
        self._carry_position: tuple[dict, int] | None = None
        self._exhausted = False

    def __next__(self) -> dict[str, np.ndarray]:
        config, stats = self._feed.config, self._feed.stats
        groups: list[tuple[TrajectoryRows, list[rows_lib.Row]]] = []
        used = 0
        if self._carry is not None:
            # the learner may have moved on since the carried unit was filtered
            members = [(item, fresh) for item, rows in self._carry if (fresh := self._fresh(rows))]
            if members:
                groups.extend(members)
                used = sum(len(rows) for _, rows in members)
                self._kept()
            else:
                self._dropped.stale += 1
            self._carry = self._carry_position = None
        limit = config.max_trajectories
        while used < config.rows and (limit is None or len(groups) < limit):
            pulled = self._pull_unit()
            if pulled is None:
                break
            unit, position = pulled
            members = self._filter(unit)
            if not members:
                self._raise_if_starved()
                continue
            self._kept()
            size = sum(len(rows) for _, rows in members)
            over_limit = limit is not None and groups and len(groups) + len(members) > limit
            if used + size > config.rows or over_limit:
                self._carry, self._carry_position = members, position
                break
            groups.extend(members)
            used += size
        if not groups or (config.drop_remainder and used < config.rows and self._exhausted):
            raise StopIteration
        kept = self._feed.still_allowed([item for item, _ in groups])
        groups = [group for group, keep in zip(groups, kept, strict=True) if keep]
        stats.add("batches")
        stats.add("rows_emitted", sum(len(rows) for _, rows in groups))
        batch = rows_lib.pack_batch(
            [rows for _, rows in groups], config.rows, config.seq_len, config.pad_id
        )
        # Which trajectory each slot k holds, so a learner can record what it trained on.
        batch[trained_on.BATCH_KEY] = trained_on.encode_refs(
            [f"{item.tenant}/{item.trajectory_id}" for item, _ in groups], config.rows
        )
        return batch

    def _pull_unit(self) -> tuple[list[TrajectoryRows], tuple[dict, int]] | None:
        """The next unit the batcher never splits (a trajectory, or a group's items: the
        sources put a whole group in one list) and the position of its first item."""
        pulled = self._pull()
        if pulled is None:
            return None
        first, position = pulled
        unit = [first]
        while (
            first.group is not None
            and self._queue
            and self._queue[0].group == first.group
            and not self._queue[0].starts_group()  # a repeated epoch may put a group twice
        ):
            unit.append(self._pull()[0])
        return unit, position

    def _pull(self) -> tuple[TrajectoryRows, tuple[dict, int]] | None:
        """The next item and its position (parent state before its list, index in the list)."""
        while not self._queue:
            self._count_unread()
            if self._exhausted:
                return None
            state = self._parent.get_state()
            try:
                items = next(self._parent)
            except StopIteration:
                self._exhausted = True
                continue
            self._unread = getattr(items, "num_keys", len(items)) - len(items)
            self._queue.extend(items)
            self._list_state, self._taken = state, 0
        position = (self._list_state, self._taken)
        self._taken += 1
        self._keys_read += 1
        return self._queue.popleft(), position

    def _filter(
        self, unit: list[TrajectoryRows]
    ) -> list[tuple[TrajectoryRows, list[rows_lib.Row]]]:
        """The unit's members with their fresh rows; [] when it is dropped whole."""
        config, stats = self._feed.config, self._feed.stats
        needed = sum(len(item.rows) for item in unit)
        longest = max(r.length for item in unit for r in item.rows)
        if longest > config.seq_len or needed > config.rows:
            if config.too_long == "error":
                raise ValueError(self._too_long_message(unit, needed, longest))
            stats.add("dropped_too_long", len(unit))
            if config.group_by is not None:
                stats.add("dropped_too_long_groups")
            dropped = self._dropped
            dropped.too_long += 1
            dropped.longest_row = max(dropped.longest_row, longest)
            dropped.most_rows = max(dropped.most_rows, needed)
            return []
        members = [(item, fresh) for item in unit if (fresh := self._fresh(item.rows))]
        self._dropped.stale += not members
        return members

    def _too_long_message(self, unit: list[TrajectoryRows], needed: int, longest: int) -> str:
        config, first = self._feed.config, unit[0]
        batch = f"the batch is {config.rows} x {config.seq_len}"
        if config.group_by is None:
            return (
                f"trajectory {first.trajectory_id!r} ({first.tenant}) needs {needed} rows of "
                f"up to {longest} tokens; {batch}"
            )
        return (
            f"the group of {len(unit)} trajectories from {first.trajectory_id!r} "
            f"({first.tenant}, LoaderConfig.group_by={config.group_by!r}) needs {needed} rows of "
            f"up to {longest} tokens; {batch}, and a group is never split across batches"
        )

    def _count_unread(self) -> None:
        """Counts the keys of a used-up list that yielded no item. Only now, since their place
        in the list is unknown: counted late, a pass is never taken as whole too early."""
        if self._unread:
            self._keys_read += self._unread
            self._dropped.unreadable += self._unread
            self._unread = 0
            self._raise_if_starved()

    def _kept(self) -> None:
        self._dropped = DropTally()
        # the uncounted keys of this list may lie before it: placing it after them never makes
        # a pass look whole too early
        self._last_kept_at = self._keys_read + self._unread

    def _raise_if_starved(self) -> None:
        """Raises once dropping is all this iterator can do (see the module docstring)."""
        config, dropped = self._feed.config, self._dropped
        unit = "trajectory" if config.group_by is None else "group"
        if self._stream:
            starved = bool(config.starved_after) and dropped.too_long >= config.starved_after
            units = "trajectories" if config.group_by is None else "groups"
            what = f"the stream dropped {dropped.too_long} {units} in a row and kept none"
        elif self._pass_size is not None:
            size = self._pass_size
            if self._aligned:  # a whole pass [b, b + size) read since the last keep
                next_pass = -(-self._last_kept_at // size) * size
                starved = size > 0 and self._keys_read >= next_pass + size
            else:  # restored mid-pass: any 2 * size - 1 keys in a row hold a whole pass
                starved = size > 0 and self._keys_read - self._last_kept_at >= 2 * size - 1
            what = f"a whole pass over the {size} trajectories of this epoch kept none"
        else:
            return  # a finite epoch ends by itself
        if starved:
            raise LoaderStarvedError(
                f"{what}: {dropped.describe(config.rows, config.seq_len, unit)} "
                "(LoaderConfig.too_long='error' names the first one)"
            )

    def _fresh(self, rows: list[rows_lib.Row]) -> list[rows_lib.Row]:
        """The rows within `max_staleness` of the learner's version now (drops counted)."""
        config, stats = self._feed.config, self._feed.stats
        if config.max_staleness is None:
            return rows
        oldest = self._feed.current_version() - config.max_staleness
        fresh = [r for r in rows if r.min_version() < 0 or r.min_version() >= oldest]
        if len(fresh) < len(rows) and config.staleness_unit == "trajectory":
            stats.add("dropped_stale_rows", len(rows))
            return []
        stats.add("dropped_stale_rows", len(rows) - len(fresh))
        return fresh

    def get_state(self) -> dict[str, Any]:
        # A carried trajectory is re-read after a restore: the state points at it.
        if self._carry is not None:
            parent, skip = self._carry_position
        elif self._queue:
            parent, skip = self._list_state, self._taken
        else:
            parent, skip = self._parent.get_state(), 0
        return {"parent": parent, "skip": skip}

    def set_state(self, state: dict[str, Any]) -> None:
        self._parent.set_state(state["parent"])
        self._queue.clear()
        self._carry = self._carry_position = None
        # Keys read from here on no longer line up with passes; a stream revived after going
        # idle keeps counting what it dropped since its last keep.
        self._last_kept_at, self._aligned, self._unread = self._keys_read, False, 0
        if not self._stream:
            self._dropped = DropTally()
        self._exhausted = False  # a stream that went idle may have new data after a restore
        if state["skip"]:
            self._list_state = self._parent.get_state()
            items = list(next(self._parent))
            self._queue.extend(items[state["skip"] :])
            self._taken = state["skip"]


class StreamSource(grain.IterDataset):
    """Lists of trajectories closed after a per-tenant cursor, in commit order, polling for more."""

    def __init__(
        self,
        feed: TrajectoryFeed,
        shard: grain.sharding.ShardOptions,
        poll_interval_s: float,
        idle_timeout_s: float | None,
        read_group: int,
    ):
        super().__init__()
        self._feed = feed
        self._shard = shard
        self._poll_interval_s = poll_interval_s
        self._idle_timeout_s = idle_timeout_s
        self._read_group = read_group

    def __iter__(self) -> _StreamIterator:
        return _StreamIterator(self)


class _StreamIterator(grain.DatasetIterator):
    def __init__(self, source: StreamSource):
        super().__init__()
        self._source = source
        self._cursors = dict.fromkeys(source._feed.tenants(), 0)
        # (tenant, row) -> when this iterator first saw a closed trajectory still waiting for a
        # late reward (`LoaderConfig.reward_grace_s`)
        self._waiting: dict[tuple[str, int], float] = {}
        # groups passed per tenant (with `group_by`): shards deal out groups by this ordinal
        self._groups = dict.fromkeys(source._feed.tenants(), 0)

    def __next__(self) -> list[TrajectoryRows]:
        source, feed = self._source, self._source._feed
        idle_since = time.monotonic()
        while True:
            keys, groups = self._next_keys()
            if keys:
                items = feed.load_many(keys, groups)
                if items:
                    return items
                continue  # everything in this group was filtered out: look further
            waited = time.monotonic() - idle_since
            if source._idle_timeout_s is not None and waited >= source._idle_timeout_s:
                raise StopIteration
            if not feed.refresh():
                time.sleep(source._poll_interval_s)

    def _next_keys(self) -> tuple[list[tuple[str, int]], list[tuple[str, int]] | None]:
        """Up to a read group of this shard's newly closed trajectories (whole groups with
        `group_by`) and the group of each (None without); advances the cursors."""
        source, keys, groups = self._source, [], []
        feed = source._feed
        group_by = feed.config.group_by
        for tenant in feed.tenants():
            order = feed.close_order(tenant)
            while self._cursors[tenant] < len(order) and len(keys) < source._read_group:
                position = self._cursors[tenant]
                # one append closes its trajectories together: a group at the end of what is
                # visible is complete
                length = feed.group_length(tenant, position)
                ordinal = position if group_by is None else self._groups[tenant]
                if not self._rewarded(tenant, order[position : position + length]):
                    break  # in commit order: the rest of this tenant waits behind it
                if group_by is not None:
                    self._groups[tenant] += 1
                self._cursors[tenant] += length
                # by position in the close order (group ordinal with `group_by`), the same on
                # every host (trajectory rows are record offsets: their parity follows event
                # counts and can starve a shard)
                if ordinal % source._shard.shard_count == source._shard.shard_index:
                    members = order[position : position + length]
                    keys.extend((tenant, row) for row in members)
                    groups.extend([(tenant, members[0])] * length)
        return keys, (groups if group_by is not None else None)

    def _rewarded(self, tenant: str, rows: Sequence[int]) -> bool:
        """Whether trajectories `rows` may be streamed now: each has a late reward, or waited
        `reward_grace_s` since this iterator first saw it closed."""
        grace = self._source._feed.config.reward_grace_s
        if grace <= 0:
            return True
        now = time.monotonic()
        ready = True
        for row in rows:
            if not self._source._feed.has_late_reward(tenant, row):
                ready &= now - self._waiting.setdefault((tenant, row), now) >= grace
        if ready:
            for row in rows:
                self._waiting.pop((tenant, row), None)
        return ready

    def get_state(self) -> dict[str, Any]:
        if self._source._feed.config.group_by is None:
            return {"cursors": dict(self._cursors)}
        return {"cursors": dict(self._cursors), "groups": dict(self._groups)}

    def set_state(self, state: dict[str, Any]) -> None:
        cursors = state["cursors"]
        if set(cursors) != set(self._cursors):
            raise ValueError(
                f"stream state is for tenants {sorted(cursors)}, this stream reads "
                f"{sorted(self._cursors)}"
            )
        grouped = self._source._feed.config.group_by is not None
        if grouped != ("groups" in state):
            raise ValueError(
                "stream state was saved "
                + ("without" if grouped else "with")
                + " LoaderConfig.group_by and this stream reads "
                + ("with" if grouped else "without")
                + " it: the shards would deal out other trajectories"
            )
        self._source._feed.refresh()
        self._cursors = {t: int(c) for t, c in cursors.items()}
        if grouped:
            self._groups = {t: int(state["groups"][t]) for t in cursors}
