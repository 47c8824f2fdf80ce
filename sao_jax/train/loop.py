"""The online RL loop: rollout engine -> ATDP buffer -> loader stream -> learner -> publication.

`OnlineTrainer` owns the learner's side of the cycle. It never touches an episode: batches come
from an `atdp_io` loader stream over the tenant the engine writes, and new weights leave through
a `WeightPublisher` (versioned, atomic). Two schedules:

- asynchronous: the engine's workers play continuously with the latest published weights; the
  learner trains on whatever the stream delivers (the engine's admission control and the
  loader's staleness filter bound how old a sample may be);
- synchronous: each round the engine plays `episodes_per_round` episodes with the current
  weights, the learner trains on every batch they fill, then publishes.

A stream that goes idle for `idle_timeout_s` hands over its partial batch and is revived, so a
batch that cannot fill (too few episodes admitted for the batch size) never hangs the loop.

Several processes (a multi-host job): each runs its own engine into its own ATDP partition and
its own loader over it, and the learner's iteration is one SPMD step over every process's rows.
So the processes agree before each iteration (`sao_jax.distributed.host_sync`): when no
process has a batch the round ends everywhere; when some do, a process without one brings an
empty batch (all padding) and every process iterates; a stop asked by any process stops all.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Protocol

import jax
import numpy as np

from atdp_io.rows import pack_batch
from sao_jax.distributed.host_sync import allgather_numbers, any_process
from sao_jax.train.learner import Learner


class RolloutSource(Protocol):
    """What the loop needs of a rollout engine (`sao_jax.rollout.RolloutEngine`)."""

    def start(self) -> Any: ...

    def stop(self) -> None: ...

    def generate(self, num_episodes: int) -> dict: ...

    def guard(self, iterator: Iterator) -> Iterator: ...

    def raise_if_failed(self) -> None: ...


class OnlineTrainer:
    """Trains `learner` on the batches a rollout engine's episodes produce.

    Args:
      learner: the learner; its `policy_version` stamps published weights.
      loader: an `atdp_io.loader.AtdpLoader` over the engine's tenant, whose `current_version`
        reads `learner.policy_version` (the staleness filter).
      publisher: the engine's `WeightPublisher`.
      engine: the rollout engine.
      asynchronous: the schedule (must match the engine's).
      episodes_per_round: episodes a synchronous round plays.
      idle_timeout_s: how long the stream may see no new trajectory before a partial batch.
      poll_interval_s: the stream's storage polling period.
    """

    def __init__(
        self,
        learner: Learner,
        loader: Any,
        publisher: Any,
        engine: RolloutSource,
        *,
        asynchronous: bool,
        episodes_per_round: int,
        idle_timeout_s: float = 5.0,
        poll_interval_s: float = 0.05,
    ):
        if episodes_per_round < 1:
            raise ValueError(f"episodes_per_round must be >= 1, got {episodes_per_round}")
        self.learner, self.publisher, self.engine = learner, publisher, engine
        self.asynchronous = asynchronous
        self.episodes_per_round = episodes_per_round
        timeout = idle_timeout_s if asynchronous else min(idle_timeout_s, 4 * poll_interval_s)
        self.iterator = iter(loader.stream(poll_interval_s=poll_interval_s, idle_timeout_s=timeout))
        self.timing = {"wait_seconds": 0.0, "learner_seconds": 0.0, "rollout_seconds": 0.0}
        self._running = False
        self.collective = jax.process_count() > 1
        self.contributors = 0  # processes whose rows are in the latest batch (collective)
        geometry = loader.config
        self._empty = pack_batch([], geometry.rows, geometry.seq_len, geometry.pad_id)

    # -- data position (checkpointed with the learner) -------------------------------------------

    def data_state(self) -> dict:
        """The stream iterator's position (JSON), for checkpoint metadata."""
        return self.iterator.get_state()

    def set_data_state(self, state: Mapping) -> None:
        self.iterator.set_state(dict(state))

    # -- weights ---------------------------------------------------------------------------------

    def publish(self) -> None:
        """Publish the learner's current policy as its `policy_version` (if newer)."""
        version = self.learner.policy_version
        if version > self.publisher.version:
            self.publisher.publish(self.learner.policy_module(copy=False), version)
            self.learner.on_weights_published()

    # -- the loop --------------------------------------------------------------------------------

    def batches(self) -> Iterator[dict[str, np.ndarray]]:
        """Training batches in the chosen schedule (forever; the caller stops)."""
        while True:
            self._play_round()
            emitted = False
            # A stream that runs dry has refreshed after this instant and passed (trained on or
            # dropped) everything committed before it; the iterator was reset when the last
            # round ended, so its read-ahead cannot predate it.
            round_began = time.monotonic()
            source = self._source()
            while (batch := self._next_or_none(source)) is not None:
                emitted = True
                yield batch
            if self.asynchronous:
                # Retire those episodes from the engine's admission, or a learner that passes
                # episodes without publishing a version (loader drops, skipped steps) waits
                # forever on an engine that waits for a version (a livelock).
                self._retire(round_began)
                if not emitted:
                    self.engine.raise_if_failed()

    def _agreed_batches(self) -> Iterator[dict[str, np.ndarray]]:
        """`batches()` of a multi-process job: every process yields the same number of batches
        (its own rows, or an empty batch when its stream went idle while another had rows)."""
        while True:
            self._play_round()
            source = self._source()
            round_began = time.monotonic()
            while True:
                batch = self._next_or_none(source)
                if batch is None and self.asynchronous:  # this stream ran dry (see batches())
                    self._retire(round_began)
                    round_began = time.monotonic()
                self.contributors = int(allgather_numbers([float(batch is not None)]).sum())
                if not self.contributors:
                    break  # idle everywhere: the round is over (async: keep waiting)
                yield self._empty if batch is None else batch
            if self.asynchronous:
                self.engine.raise_if_failed()

    def _play_round(self) -> None:
        """The synchronous schedule plays a round of episodes before each read; async: none."""
        if not self.asynchronous:
            start = time.perf_counter()
            self.engine.generate(self.episodes_per_round)
            self.timing["rollout_seconds"] += time.perf_counter() - start

    def _source(self) -> Iterator[dict[str, np.ndarray]]:
        """The loader stream; asynchronous: guarded, so a failed rollout worker surfaces."""
        return self.engine.guard(self.iterator) if self.asynchronous else self.iterator

    def _retire(self, round_began: float) -> None:
        """Tell the engine's admission that the stream passed what was committed before
        `round_began` (sources without admission control need nothing)."""
        mark_consumed = getattr(self.engine, "mark_consumed", None)
        if mark_consumed is not None:
            mark_consumed(round_began)

    def _next_or_none(self, source: Iterator) -> dict[str, np.ndarray] | None:
        """The stream's next batch with a trajectory, or None once it goes idle (the stream is
        then revived at its position, so it resumes with new commits)."""
        start = time.perf_counter()
        try:
            while True:
                batch = next(source)
                if (batch["traj_index"] >= 0).any():
                    return batch
        except StopIteration:
            self.iterator.set_state(self.iterator.get_state())
            return None
        finally:
            self.timing["wait_seconds"] += time.perf_counter() - start

    def run(
        self,
        policy_steps: int,
        on_iteration: Callable[[dict[str, float]], bool | None] | None = None,
    ) -> None:
        """Iterate until the learner reaches `policy_steps` policy updates.

        `on_iteration(metrics)` runs after each iteration (metrics include `time/...`); it may
        return True to stop early. The engine is started (async) and stopped here.
        """
        if self.asynchronous:
            self.engine.start()
        try:
            if self.learner.policy_version >= policy_steps:
                return
            batches = self._agreed_batches() if self.collective else self.batches()
            for batch in batches:
                start = time.perf_counter()
                metrics = self.learner.iteration(batch)
                self.publish()
                self.timing["learner_seconds"] += time.perf_counter() - start
                metrics.update({f"time/{k}": v for k, v in self.timing.items()})
                if self.collective:
                    metrics["batch/processes_with_rows"] = float(self.contributors)
                stop = bool(on_iteration(metrics)) if on_iteration is not None else False
                if self.collective:  # a stop asked by one process (its budget) stops every one
                    stop = any_process(stop)
                if stop or self.learner.policy_version >= policy_steps:
                    return
        finally:
            if self.asynchronous:
                self.engine.stop()
