"""Rollout engine: synchronous schedule, asynchronous staleness-bounded admission that resumes
on publish, stale drops counted, worker exceptions surface in the learner's thread."""

import itertools
import threading
import time

import numpy as np
import pytest
from rollout_testlib import (
    borrowed_sampler,
    env_config,
    model,
    open_store,
    other_weights,
    rollout_config,
    tokenizer,
)

from atdp_io.loader import AtdpLoader, LoaderConfig
from sao_jax.rollout import EngineConfig, RolloutEngine, WeightPublisher, WorkerError


def make_engine(writer, publisher, sampler, **config):
    engine_config = EngineConfig(**{"envs_per_worker": 4, "episodes_per_version": 4, **config})
    return RolloutEngine(
        model(),
        tokenizer(),
        writer,
        publisher,
        rollout=rollout_config(),
        env=env_config(max_steps=2),
        config=engine_config,
        samplers=[sampler],
    )


def committed(store, tenant="alfworld"):
    reader = store.reader(tenant, principal=tenant)
    reader.refresh()
    return [reader.read(i) for i in reader.trajectory_ids()]


def versions_of(trajectory):
    return {int(v) for _, e in trajectory.llm_events() for v in e.llm.output_versions}


def wait_until(predicate, timeout=60.0):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def test_sync_schedule_plays_exactly_n_with_the_current_weights(tmp_path):
    store, publisher = open_store(tmp_path), WeightPublisher()
    with borrowed_sampler() as sampler, store.writer("alfworld") as writer:
        engine = make_engine(writer, publisher, sampler, asynchronous=False)
        assert publisher.version == 0  # the engine published the initial weights
        with pytest.raises(RuntimeError, match="generate"):
            engine.start()
        first = engine.generate(5)
        assert first["episodes"] == 5 and first["env_steps"] == 10
        publisher.publish(other_weights(), 1)
        second = engine.generate(3)
        assert second["episodes"] == 3
        trajectories = committed(store)
        assert [versions_of(t) for t in trajectories] == [{0}] * 5 + [{1}] * 3
        stats = engine.stats()
        assert stats["episodes"] == 8 and stats["weight_syncs"] == 1
        assert stats["dropped_stale"] == 0 and stats["truncated_step_limit"] == 8
        assert stats["replayed_tasks"] == 0  # failed-task replay is off by default


def test_failed_task_replay_reaches_the_workers_streams(tmp_path):
    """`EnvConfig.replay_failed`: the workers tell their task streams each outcome, so games
    the policy failed come back, and the engine counts the replays."""
    store, publisher = open_store(tmp_path), WeightPublisher()
    with borrowed_sampler() as sampler, store.writer("alfworld") as writer:
        engine = RolloutEngine(
            model(),
            tokenizer(),
            writer,
            publisher,
            rollout=rollout_config(),
            env=env_config(max_steps=2, replay_failed=0.6, replay_limit=1),
            config=EngineConfig(envs_per_worker=4, episodes_per_version=4, asynchronous=False),
            samplers=[sampler],
        )
        engine.generate(16)
        stats = engine.stats()
        (state,) = engine.task_replay_state()  # one worker, one stream (for a checkpoint)
        assert state["replays_served"] == stats["replayed_tasks"]
        with pytest.raises(ValueError, match=r"2 worker stream.*1 workers"):
            engine.restore_task_replay([state, state])
    episodes = committed(store)
    games = [t.header.task["index"] for t in episodes]
    won = {t.header.task["index"] for t in episodes if t.outcome.success}
    assert stats["replayed_tasks"] == len(games) - len(set(games)) > 0
    # each replay is of a game that had been played and lost (replay_limit=1: once only)
    counts = {g: games.count(g) for g in games}
    assert all(n <= 2 for n in counts.values())
    assert not won & {g for g, n in counts.items() if n == 2}


def test_async_admission_stays_within_eta_versions_and_resumes_on_publish(tmp_path):
    """With eta = 1 and B = 4 the workers start (1 + v + 1) * 4 episodes, then wait; the
    learner reads them through the loader stream and each publish admits B more."""
    store, publisher = open_store(tmp_path), WeightPublisher()
    syncs = []
    with borrowed_sampler() as sampler, store.writer("alfworld") as writer:
        engine = make_engine(writer, publisher, sampler, max_staleness=1)
        engine.on_weight_sync = lambda worker, version: syncs.append((worker, version))
        loader = AtdpLoader(
            store,
            ["alfworld"],
            principal="alfworld",
            config=LoaderConfig(rows=8, seq_len=1024, layout="windowed", max_staleness=1),
            current_version=lambda: publisher.version,
        )
        with engine:
            batches = engine.guard(iter(loader.stream(poll_interval_s=0.02)))
            seen = 0
            for step in itertools.count():
                batch = next(batches)
                seen += int(batch["traj_index"].max()) + 1
                if seen >= 8:
                    break
                assert step < 20
            wait_until(lambda: engine.stats()["episodes"] == 8)
            time.sleep(0.3)  # room for a ninth episode, if admission leaked one
            assert engine.stats()["started_episodes"] == 8
            publisher.publish(other_weights(), 1)
            wait_until(lambda: engine.stats()["episodes"] == 12)
            assert engine.stats()["started_episodes"] == 12
        stats = engine.stats()
        assert not engine.running and syncs == [(0, 1)]
        assert stats["episodes"] + stats["dropped_stale"] + stats["abandoned_episodes"] == 12
        versions = [versions_of(t) for t in committed(store)]
        assert all(v <= {0, 1} for v in versions) and {1} in versions


def test_stale_episodes_are_dropped_and_counted(tmp_path):
    """eta = 0: episodes whose tokens predate a publish that happened while they ran are
    dropped at completion, counted, and never written."""
    store, publisher = open_store(tmp_path), WeightPublisher()
    with borrowed_sampler() as sampler, store.writer("alfworld") as writer:
        engine = make_engine(writer, publisher, sampler, asynchronous=False, max_staleness=0)
        env = engine.loops[0].envs[0]
        original_step = env.step

        def step_and_publish(command):
            if publisher.version == 0:
                publisher.publish(other_weights(), 1)
            return original_step(command)

        env.step = step_and_publish
        stats = engine.generate(4)
        assert stats["episodes"] == 0 and engine.stats()["dropped_stale"] == 4
        assert committed(store) == []
        assert engine.generate(4)["episodes"] == 4  # fresh weights: nothing dropped
        assert [versions_of(t) for t in committed(store)] == [{1}] * 4


def failing_step(env, after: int):
    calls = itertools.count()
    original = env.step

    def step(command):
        if next(calls) >= after:
            raise RuntimeError("env exploded")
        return original(command)

    env.step = step


def test_worker_exception_surfaces_in_the_learner_instead_of_a_hang(tmp_path):
    store, publisher = open_store(tmp_path), WeightPublisher()
    with borrowed_sampler() as sampler, store.writer("alfworld") as writer:
        engine = make_engine(writer, publisher, sampler)
        failing_step(engine.loops[0].envs[0], after=1)
        loader = AtdpLoader(
            store,
            ["alfworld"],
            principal="alfworld",
            config=LoaderConfig(rows=64, seq_len=1024, layout="windowed"),
        )
        engine.start()
        start = time.monotonic()
        with pytest.raises(WorkerError, match="env exploded") as caught:
            for _ in engine.guard(iter(loader.stream(poll_interval_s=0.02))):
                pass  # 64 rows never fill: a blocked stream without the guard
        assert isinstance(caught.value.__cause__, RuntimeError)
        assert time.monotonic() - start < 60 and not engine.running
        assert not [t for t in threading.enumerate() if t.name == "guarded-iterator"]
        with pytest.raises(WorkerError):
            engine.stop()

        sync = make_engine(writer, publisher, sampler, asynchronous=False)
        failing_step(sync.loops[0].envs[2], after=0)
        with pytest.raises(WorkerError, match="env exploded"):
            sync.generate(4)


def test_engine_config_errors_name_the_problem(tmp_path):
    store, publisher = open_store(tmp_path), WeightPublisher()
    with pytest.raises(ValueError, match="max_staleness"):
        EngineConfig(max_staleness=-1)
    with pytest.raises(ValueError, match="envs_per_worker"):
        EngineConfig(envs_per_worker=0)
    with borrowed_sampler() as sampler, store.writer("other") as writer:
        with pytest.raises(ValueError, match="tenant 'other'"):
            make_engine(writer, publisher, sampler)
        with pytest.raises(ValueError, match="2 workers"):
            make_engine(writer, publisher, sampler, tenant="other", num_workers=2)
        with pytest.raises(ValueError, match="group_size"):
            RolloutEngine(
                model(),
                tokenizer(),
                writer,
                publisher,
                rollout=rollout_config(group_size=8),
                config=EngineConfig(tenant="other", episodes_per_version=4),
                samplers=[sampler],
            )
    assert np.isclose(publisher.version, -1)
