"""Asynchronous single-rollout engine: workers play episodes while the learner trains.

Each worker (a thread here, a host on a pod) owns a `Sampler` and a batch of envs, plays with
the latest published weights (synced between decode dispatches), and writes every finished
episode group to the ATDP buffer; the learner reads that buffer through `atdp_io.loader`.

Staleness control (AReaL; docs/algorithms.md, "Staleness"), with eta = `max_staleness`, B =
`episodes_per_version` and v = the latest published version:
- admission (`admission.AdmissionBudget`): a group starts only while the OUTSTANDING episodes
  stay within (eta + 1) * B: started, minus those dropped as stale, minus those the learner
  has retired: B per version published since the engine was built (AReaL) or, when more,
  those its side reported consumed (`mark_consumed`: trained on or dropped by the loader).
  Episodes the learner passes without a new version (loader drops, skipped policy steps)
  therefore never block admission for good;
- on completion: an episode whose oldest token is more than eta versions behind v is dropped
  and counted (`dropped_stale`); the loader filters by version again at batch time. These two
  filters, not admission, are what guarantee that no sample older than eta versions trains.

`asynchronous=False` is the synchronous schedule: `generate(n)` plays n episodes with the
current weights and returns once they are written; the learner then trains and publishes.

A worker's exception stops the engine and is re-raised in the caller's thread by `generate`,
`stop`, `raise_if_failed`, and by `guard(iterator)` around the learner's loader iterator, so a
dead worker never leaves the learner blocked on a stream that will not grow.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence

from atdp_io import PartitionWriter
from sao_jax.models import Transformer
from sao_jax.rollout.admission import AdmissionBudget
from sao_jax.rollout.agent_loop import AgentLoop, EnvConfig, RolloutConfig
from sao_jax.rollout.episode import Episode
from sao_jax.rollout.guard import guarded
from sao_jax.rollout.sampler import Sampler
from sao_jax.rollout.stats import RolloutStats
from sao_jax.rollout.weights import WeightPublisher, WeightSnapshot
from sao_jax.tokenizers import Tokenizer


@dataclasses.dataclass(frozen=True)
class EngineConfig:
    """num_workers: rollout workers (threads); envs_per_worker: their KV-cache slots.
    asynchronous: overlap rollouts with training (False: `generate` on demand).
    max_staleness: eta, versions a sample may lag the latest weights (0: on-policy batches).
    episodes_per_version: B, episodes the learner consumes per policy version (admission).
    tenant: ATDP tenant the episodes are written to (must match the writer's partition).
    """

    num_workers: int = 1
    envs_per_worker: int = 32
    asynchronous: bool = True
    max_staleness: int = 2
    episodes_per_version: int = 32
    tenant: str = "alfworld"

    def __post_init__(self):
        for name in ("num_workers", "envs_per_worker", "episodes_per_version"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"EngineConfig.{name} must be a positive int, got {value!r}")
        if not isinstance(self.max_staleness, int) or self.max_staleness < 0:
            raise ValueError(
                f"EngineConfig.max_staleness must be an int >= 0, got {self.max_staleness!r}"
            )


class WorkerError(RuntimeError):
    """A rollout worker failed; `__cause__` is its exception."""


class RolloutEngine:
    """Rollout workers, weight sync, staleness control and ATDP writing.

    Args:
      policy: a `Transformer` giving the architecture (its weights are used only if nothing
        was published yet, then published as version 0 through `publisher`).
      tokenizer: the policy's tokenizer.
      writer: the ATDP `PartitionWriter` of `config.tenant` (thread-safe, shared by workers).
      publisher: where the learner publishes weights.
      rollout, env, config: `RolloutConfig`, `EnvConfig` (worker w plays seed `env.seed + w`),
        `EngineConfig`.
      on_weight_sync: called as `fn(worker_id, version)` each time a worker picks up new
        weights (e.g. for the learner's optional optimizer reset).
      sampler_kwargs: extra `Sampler` arguments (mesh, rules, ...).
      samplers: one `Sampler` per worker to use instead of building them (keeps their
        compiled kernels across engines); their weights are replaced by the publisher's.
    """

    def __init__(
        self,
        policy: Transformer,
        tokenizer: Tokenizer,
        writer: PartitionWriter,
        publisher: WeightPublisher,
        *,
        rollout: RolloutConfig | None = None,
        env: EnvConfig | None = None,
        config: EngineConfig | None = None,
        on_weight_sync: Callable[[int, int], None] | None = None,
        sampler_kwargs: dict | None = None,
        samplers: Sequence[Sampler] | None = None,
        run_id: str | None = None,
    ):
        rollout, env = rollout or RolloutConfig(), env or EnvConfig()
        config = config or EngineConfig()
        if writer.tenant != config.tenant:
            raise ValueError(
                f"the writer is for tenant {writer.tenant!r} but EngineConfig.tenant is "
                f"{config.tenant!r}"
            )
        if samplers is not None and len(samplers) != config.num_workers:
            raise ValueError(f"got {len(samplers)} samplers for {config.num_workers} workers")
        if rollout.group_size > config.episodes_per_version:
            raise ValueError(
                f"group_size ({rollout.group_size}) exceeds episodes_per_version "
                f"({config.episodes_per_version}): no group could ever be admitted"
            )
        self.tokenizer, self.writer, self.publisher = tokenizer, writer, publisher
        self.rollout, self.env, self.config = rollout, env, config
        self.on_weight_sync = on_weight_sync
        self.run_id = run_id or uuid.uuid4().hex[:12]
        if publisher.latest() is None:
            publisher.publish(policy, 0)
        snapshot = publisher.latest()
        self.loops: list[AgentLoop] = []
        for w in range(config.num_workers):
            if samplers is not None:
                sampler = samplers[w]
            else:
                sampler = Sampler(policy, pad_id=tokenizer.pad_id, **(sampler_kwargs or {}))
            # Never keep the learner's own buffers: they may be donated by its next step.
            sampler.update_weights(snapshot.params, snapshot.version)
            envs = dataclasses.replace(env, seed=env.seed + w).make_envs(config.envs_per_worker)
            self.loops.append(
                AgentLoop(sampler, tokenizer, envs, rollout, worker_id=w, run_id=self.run_id)
            )
        self._stats = RolloutStats(env.env_class.task_types)
        self._cond = threading.Condition()
        self._budget = AdmissionBudget(
            config.max_staleness, config.episodes_per_version, first_version=snapshot.version
        )
        self._stop = threading.Event()
        self._error: BaseException | None = None
        self._threads: list[threading.Thread] = []
        self._pending_writes: list = []
        self._unsubscribe: Callable[[], None] | None = None

    # --------------------------------------------------------------------------- control
    def set_temperature(self, temperature: float) -> None:
        """Every worker decodes the episodes it starts from now on at `temperature` (> 0;
        `AgentLoop.set_temperature`: an episode keeps the temperature it started with)."""
        for loop in self.loops:
            loop.set_temperature(temperature)

    @property
    def temperature(self) -> float:
        """The temperature the next episodes start with."""
        return self.loops[0].temperature

    def start(self) -> RolloutEngine:
        """Start the asynchronous workers (asynchronous mode only)."""
        if not self.config.asynchronous:
            raise RuntimeError("start() is for asynchronous=True; call generate(n) instead")
        if self._threads:
            raise RuntimeError("the engine is already running")
        self._stop.clear()
        self._unsubscribe = self.publisher.subscribe(self._on_publish)
        self._threads = [
            threading.Thread(
                target=self._run_worker, args=(loop, None), name=f"rollout-{loop.worker_id}"
            )
            for loop in self.loops
        ]
        for thread in self._threads:
            thread.start()
        return self

    def stop(self, timeout: float | None = 60.0) -> None:
        """Stop the workers (in-progress episodes are abandoned), flush the writer, and
        re-raise a worker's exception if one failed."""
        self._stop.set()
        with self._cond:
            self._cond.notify_all()
        for thread in self._threads:
            thread.join(timeout)
            if thread.is_alive():
                raise TimeoutError(f"{thread.name} did not stop within {timeout} s")
        self._threads = []
        if self._unsubscribe is not None:
            self._unsubscribe()
            self._unsubscribe = None
        self._flush()
        self.raise_if_failed()

    def __enter__(self) -> RolloutEngine:
        return self.start() if self.config.asynchronous else self

    def __exit__(self, exc_type, *exc) -> None:
        if exc_type is None:
            self.stop()
            return
        with contextlib.suppress(Exception):  # the learner's error wins over a worker's
            self.stop()

    @property
    def running(self) -> bool:
        return any(t.is_alive() for t in self._threads)

    def generate(self, num_episodes: int) -> dict:
        """Synchronous schedule: play `num_episodes` (rounded up to whole groups) with the
        current weights, spread over the workers; returns once they are written.

        Returns the stats of this call's episodes.
        """
        if self.config.asynchronous:
            raise RuntimeError("generate() is for asynchronous=False; use start()/stop()")
        if num_episodes < 1:
            raise ValueError(f"num_episodes must be >= 1, got {num_episodes}")
        self.raise_if_failed()
        group = self.rollout.group_size
        groups = -(-num_episodes // group)
        per_worker = [
            groups // len(self.loops) + (w < groups % len(self.loops))
            for w in range(len(self.loops))
        ]
        batch = RolloutStats(self.env.env_class.task_types)
        self._stop.clear()
        threads = [
            threading.Thread(
                target=self._run_worker,
                args=(loop, n * group, batch),
                name=f"rollout-{loop.worker_id}",
            )
            for loop, n in zip(self.loops, per_worker, strict=True)
            if n
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        self._flush()
        self.raise_if_failed()
        return batch.snapshot()

    def raise_if_failed(self) -> None:
        """Re-raise (as `WorkerError`) the first exception of any worker."""
        if self._error is not None:
            raise WorkerError(f"a rollout worker failed: {self._error!r}") from self._error

    def mark_consumed(self, committed_before: float) -> int:
        """The learner's side has taken every episode committed before `committed_before` (a
        `time.monotonic()` value) off its loader stream, training on it or dropping it.

        Those episodes stop counting against admission even if no new version was published
        (`OnlineTrainer` calls this each time its stream runs dry, with the time its read
        began). Returns how many episodes this retired.
        """
        with self._cond:
            retired = self._budget.mark_consumed(committed_before)
            if retired:
                self._cond.notify_all()
        return retired

    def stats(self) -> dict:
        """Counters since construction (see `RolloutStats`), plus `started_episodes`,
        `consumed_episodes` (reported by `mark_consumed`), `outstanding_episodes` (what
        admission counts now), `policy_version` (latest published), `abandoned_episodes` and
        `replayed_tasks` (draws of the task streams that replayed a failed task)."""
        snapshot = self._stats.snapshot()
        version = self.publisher.version
        with self._cond:
            snapshot["started_episodes"] = self._budget.started
            snapshot["consumed_episodes"] = self._budget.consumed
            snapshot["outstanding_episodes"] = self._budget.outstanding(version)
        snapshot["policy_version"] = version
        snapshot["abandoned_episodes"] = sum(loop.abandoned_episodes for loop in self.loops)
        # tasks the workers' streams drew as replays of failed ones (`EnvConfig.replay_failed`)
        snapshot["replayed_tasks"] = sum(loop.envs[0].sampler.replays_served for loop in self.loops)
        return snapshot

    def task_replay_state(self) -> list[dict]:
        """Each worker's task stream's failed-task replay state (`TaskSampler.replay_state`),
        for a checkpoint."""
        return [loop.envs[0].sampler.replay_state() for loop in self.loops]

    def restore_task_replay(self, states: Sequence[dict]) -> None:
        """Give each worker's task stream back the replay state `task_replay_state` saved."""
        if len(states) != len(self.loops):
            raise ValueError(
                f"the saved task replay has {len(states)} worker stream(s), this engine has "
                f"{len(self.loops)} workers: resume with the same rl.num_workers"
            )
        pairs = [
            (loop.envs[0].sampler, state) for loop, state in zip(self.loops, states, strict=True)
        ]
        for sampler, state in pairs:  # all checked before any changes
            sampler.checked_replay_state(state)
        for sampler, state in pairs:
            sampler.restore_replay_state(state)

    def guard(self, iterator: Iterator, poll_s: float = 0.2) -> Iterator:
        """Yield from `iterator` (e.g. `iter(loader.stream())`), raising a worker's exception
        (`WorkerError`) instead of waiting forever for data that will not come. See
        `sao_jax.rollout.guard.guarded`."""
        return guarded(iterator, self.raise_if_failed, poll_s=poll_s)

    # -------------------------------------------------------------------------- workers
    def _run_worker(
        self, loop: AgentLoop, max_episodes: int | None, batch: RolloutStats | None = None
    ) -> None:
        sampler = loop.sampler
        waited = 0.0  # admission waits are not rollout time

        def before_dispatch() -> None:
            snapshot = self.publisher.latest()
            if snapshot is not None and snapshot.version > sampler.policy_version:
                sampler.update_weights(snapshot.params, snapshot.version)
                self._stats.add("weight_syncs")
                if self.on_weight_sync is not None:
                    self.on_weight_sync(loop.worker_id, snapshot.version)

        def admit(n: int, block: bool) -> bool:
            nonlocal waited
            start = time.perf_counter()
            admitted = self._admit(n, block)
            waited += time.perf_counter() - start
            return admitted

        try:
            before_dispatch()
            mark = time.perf_counter()
            plays = loop.play(
                max_episodes=max_episodes,
                admit=admit if max_episodes is None else None,
                before_dispatch=before_dispatch,
                stop=self._stop.is_set,
            )
            for group in plays:
                now = time.perf_counter()
                self._stats.add("rollout_seconds", now - mark - waited)
                mark, waited = now, 0.0
                self._finish_group(group, batch)
            self._stats.add("rollout_seconds", time.perf_counter() - mark - waited)
        except BaseException as e:  # surfaced in the caller's thread
            with self._cond:
                if self._error is None:
                    self._error = e
                self._stop.set()
                self._cond.notify_all()

    def _admit(self, n: int, block: bool) -> bool:
        """Outstanding episodes + n <= (eta + 1) * B (see `AdmissionBudget`)."""
        with self._cond:
            while not self._budget.try_start(n, self.publisher.version):
                if not block or self._stop.is_set():
                    return False
                self._cond.wait(0.5)
            return True

    def _on_publish(self, snapshot: WeightSnapshot) -> None:
        with self._cond:
            self._cond.notify_all()

    def _finish_group(self, group: list[Episode], batch: RolloutStats | None) -> None:
        # A group is kept or dropped whole: GRPO needs every member of a group.
        lag = self.publisher.version - min(e.min_version for e in group)
        admitted = batch is None  # the synchronous schedule bypasses admission
        if lag > self.config.max_staleness:
            self._stats.add("dropped_stale", len(group))
            if admitted:
                with self._cond:
                    self._budget.drop(len(group))  # never written: frees its admission
                    self._cond.notify_all()
            return
        # One append per group: its trajectories commit contiguously, in member order.
        tenant = self.config.tenant
        future = self.writer.append_async([e.to_trajectory(tenant=tenant) for e in group])
        if admitted:
            future.add_done_callback(functools.partial(self._on_commit, len(group)))
        with self._cond:
            self._pending_writes = [f for f in self._pending_writes if not f.done()] + [future]
            self._check_writes()
        self._stats.add_episodes(group)
        if batch is not None:
            batch.add_episodes(group)

    def _on_commit(self, n: int, future) -> None:
        # Stamped once durable, so a stream that refreshed after this time has seen the group.
        if future.cancelled() or future.exception() is not None:
            return  # not in the buffer; the failure surfaces through `_check_writes`
        with self._cond:
            self._budget.commit(n, time.monotonic())

    def _check_writes(self) -> None:
        """Raise the first failed write (caller holds `_cond`)."""
        for future in self._pending_writes:
            if future.done() and future.exception() is not None:
                raise future.exception()

    def _flush(self) -> None:
        self.writer.flush()
        with self._cond:
            pending, self._pending_writes = self._pending_writes, []
        for future in pending:
            future.result()
