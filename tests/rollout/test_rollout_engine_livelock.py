"""The GRPO+SEED stall, reproduced: an asynchronous engine whose admission counted every episode
ever started waited for a new policy version, while a learner that had passed every episode
without publishing one (steps skipped, or the loader dropping what it read) waited for new
episodes. Admission now counts outstanding episodes, and the trainer reports what its stream
has passed, so both sides keep moving; the staleness filters still hold."""

import time

import numpy as np
import pytest
from rollout_testlib import (
    borrowed_sampler,
    env_config,
    model,
    open_store,
    rollout_config,
    tokenizer,
)

from atdp_io.loader import AtdpLoader, LoaderConfig
from sao_jax.rollout import EngineConfig, RolloutEngine, WeightPublisher
from sao_jax.train.loop import OnlineTrainer

ETA, B = 0, 4  # capacity (eta + 1) * B = 4 episodes while no version is published
TENANT = "alfworld"


def make_engine(writer, publisher, sampler):
    return RolloutEngine(
        model(),
        tokenizer(),
        writer,
        publisher,
        rollout=rollout_config(),
        env=env_config(max_steps=2),
        config=EngineConfig(envs_per_worker=4, max_staleness=ETA, episodes_per_version=B),
        samplers=[sampler],
    )


def make_loader(store, current_version, rows=8):
    return AtdpLoader(
        store,
        [TENANT],
        principal=TENANT,
        config=LoaderConfig(rows=rows, seq_len=1024, layout="windowed", max_staleness=ETA),
        current_version=current_version,
    )


class SkippingLearner:
    """A learner whose every policy step is skipped (non-finite loss): it takes each batch, but
    its version never advances, so no new weights are ever published."""

    policy_version = 0

    def __init__(self):
        self.batches = []

    def iteration(self, batch):
        self.batches.append(batch)
        return {"policy/skipped": 1.0, "policy_version": float(self.policy_version)}


@pytest.mark.timeout(60)
def test_a_learner_that_never_publishes_keeps_receiving_episodes(tmp_path):
    """Before the fix this hung after the first 4 episodes: admission waited for version 1."""
    store, publisher = open_store(tmp_path), WeightPublisher()
    learner = SkippingLearner()
    outstanding, target = [], 3 * (ETA + 1) * B
    with borrowed_sampler() as sampler, store.writer(TENANT) as writer:
        engine = make_engine(writer, publisher, sampler)
        trainer = OnlineTrainer(
            learner,
            make_loader(store, lambda: learner.policy_version),
            publisher,
            engine,
            asynchronous=True,
            episodes_per_round=B,
            idle_timeout_s=0.3,
            poll_interval_s=0.02,
        )

        def on_iteration(metrics):
            outstanding.append(engine.stats()["outstanding_episodes"])
            seen = sum(
                len(np.unique(b["traj_index"][b["traj_index"] >= 0])) for b in learner.batches
            )
            return seen >= target

        trainer.run(policy_steps=1, on_iteration=on_iteration)
        stats = engine.stats()
    assert not engine.running and publisher.version == 0 and learner.policy_version == 0
    assert stats["started_episodes"] >= target and stats["consumed_episodes"] >= target - B
    # admission still bounds what runs ahead of the learner
    assert max(outstanding) <= (ETA + 1) * B
    # and no sample older than eta versions reached the learner
    for batch in learner.batches:
        versions = batch["versions"][batch["loss_mask"] > 0]
        assert versions.size and (learner.policy_version - versions <= ETA).all()


@pytest.mark.timeout(60)
def test_episodes_the_loader_drops_stop_blocking_admission(tmp_path):
    """Every episode is stale for the loader (its learner is at version 5, nothing is
    published): the stream never yields, and only the consumed reports let admission go on."""
    store, publisher = open_store(tmp_path), WeightPublisher()
    loader = make_loader(store, current_version=lambda: 5)
    before_any_commit = time.monotonic()
    with borrowed_sampler() as sampler, store.writer(TENANT) as writer:
        engine = make_engine(writer, publisher, sampler)
        stream = iter(loader.stream(poll_interval_s=0.02, idle_timeout_s=0.3))
        with engine:
            deadline = time.monotonic() + 45
            while engine.stats()["consumed_episodes"] < B:
                assert time.monotonic() < deadline, "the first episodes never committed"
                round_began = time.monotonic()
                with pytest.raises(StopIteration):  # everything read is dropped as stale
                    next(stream)
                stream.set_state(stream.get_state())
                assert engine.mark_consumed(before_any_commit) == 0  # conservative
                engine.mark_consumed(round_began)
                assert engine.stats()["outstanding_episodes"] <= (ETA + 1) * B
            # admission reopened without any new version: more episodes start
            while engine.stats()["started_episodes"] <= (ETA + 1) * B:
                assert time.monotonic() < deadline, "admission stayed closed"
                time.sleep(0.02)
        stats = engine.stats()
    assert publisher.version == 0 and loader.stats.snapshot()["dropped_stale_rows"] > 0
    assert "batches" not in loader.stats.snapshot()
    assert stats["started_episodes"] > (ETA + 1) * B


def test_mark_consumed_rejects_a_time_that_is_not_one(tmp_path):
    store, publisher = open_store(tmp_path), WeightPublisher()
    with borrowed_sampler() as sampler, store.writer(TENANT) as writer:
        engine = make_engine(writer, publisher, sampler)
        with pytest.raises(ValueError, match="committed_before must be a finite"):
            engine.mark_consumed(float("nan"))
        assert engine.stats()["consumed_episodes"] == 0
