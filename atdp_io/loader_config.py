"""The settings and counters of an ATDP loader (`atdp_io.loader`), shared with its grain
stages (`atdp_io.pipeline`), which read them but never the loader itself."""

from __future__ import annotations

import dataclasses
import threading
from collections import Counter
from collections.abc import Mapping

from atdp_io import groups as groups_lib
from atdp_io import rows as rows_lib
from atdp_io.governance import EligibilityPolicy


@dataclasses.dataclass(frozen=True)
class LoaderConfig:
    """Batch geometry and filters.

    `rows` x `seq_len` is the batch shape. `too_long`: "drop" (counted) or "error" for a
    trajectory with a row longer than `seq_len` or more rows than `rows`. `max_staleness`: keep
    rows whose oldest output token is at most this many versions behind the learner (None: off);
    `staleness_unit`: drop stale "row"s or whole "trajectory"s. `reward_weights`: per-source
    weights (None sums every source). `starved_after`: a stream that drops this many
    trajectories in a row as too long raises `LoaderStarvedError` instead of waiting for one
    that fits (0: never); a repeated epoch raises it after a whole pass that kept none.
    `group_by`: None, or the header field whose value names a trajectory's group ("task.<name>",
    "session_id", "trajectory_id"; rollouts write "task.group_key"): trajectories consecutive in
    commit order with one value (a group the engine appended at once) are then never split
    across batches; a group needing more than `rows` rows, or holding a too-long trajectory, is
    dropped whole (counted) or refused under `too_long`; epochs shuffle groups.
    `max_trajectories`: a batch also closes once it holds this many trajectories (None: only
    `rows` decides). An online learner sets it to the episodes of a policy version, so each
    step trains on that many episodes however long they are, instead of on whatever filled the
    rows (a batch of the few long failures that finished last). A group is never split: one
    that would pass the limit waits for the next batch (a single group larger than it is
    batched alone).
    `reward_grace_s`: the stream holds a closed trajectory back until it has a late reward
    (`LateReward`, e.g. a serving `/rl/set_reward`) or this many seconds passed since the
    stream first saw it closed, so a reward posted just after the episode ended still reaches
    training (0: stream at close). Commit order is kept: later trajectories wait behind it.
    A reward arriving after the trajectory was streamed is kept in storage (epochs read it)
    but does not reach the stream.
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
    starved_after: int = 16
    group_by: str | None = None
    eligibility: EligibilityPolicy = dataclasses.field(default_factory=EligibilityPolicy)
    max_trajectories: int | None = None
    reward_grace_s: float = 0.0

    def __post_init__(self):
        if self.rows < 1 or self.seq_len < 1:
            raise ValueError(
                f"LoaderConfig: rows and seq_len must be >= 1, got {self.rows}, {self.seq_len}"
            )
        if self.layout not in rows_lib.LAYOUTS:
            raise ValueError(f"LoaderConfig.layout must be one of {rows_lib.LAYOUTS}")
        if self.concat_fallback not in ("windowed", "error"):
            raise ValueError("LoaderConfig.concat_fallback must be 'windowed' or 'error'")
        if self.too_long not in ("drop", "error"):
            raise ValueError("LoaderConfig.too_long must be 'drop' or 'error'")
        if self.staleness_unit not in ("row", "trajectory"):
            raise ValueError("LoaderConfig.staleness_unit must be 'row' or 'trajectory'")
        if self.max_staleness is not None and self.max_staleness < 0:
            raise ValueError("LoaderConfig.max_staleness must be >= 0 or None")
        if not (self.reward_grace_s >= 0 and self.reward_grace_s < float("inf")):
            raise ValueError(
                f"LoaderConfig.reward_grace_s must be >= 0 seconds, got {self.reward_grace_s!r}"
            )
        if self.max_trajectories is not None and (
            isinstance(self.max_trajectories, bool)
            or not isinstance(self.max_trajectories, int)
            or self.max_trajectories < 1
        ):
            raise ValueError(
                "LoaderConfig.max_trajectories must be a positive int or None, got "
                f"{self.max_trajectories!r}"
            )
        if self.starved_after < 0:
            raise ValueError(f"LoaderConfig.starved_after must be >= 0, got {self.starved_after}")
        groups_lib.check_group_by(self.group_by)


class LoaderStats:
    """Thread-safe counters of what the loader read, emitted and dropped (and why)."""

    def __init__(self):
        self._lock = threading.Lock()
        self._counts: Counter = Counter()

    def add(self, key: str, n: int = 1) -> None:
        if n:
            with self._lock:
                self._counts[key] += n

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return dict(self._counts)
