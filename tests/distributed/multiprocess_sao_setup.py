"""What the 2-process SAO test and its worker processes share: model, learner, data."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import grain

sys.path.insert(0, str(Path(__file__).parents[1] / "train"))
from train_factories import TENANT, episode, loader, write_store

from sao_jax.models import get_model_config
from sao_jax.train import CriticConfig, LearnerConfig, OptimizerConfig

ROWS = 4  # per process: the global batch has 8 rows
SEQ_LEN = 48
EPISODES = 8  # 4 per process
MODEL = get_model_config(
    "test", vocab_size=48, num_layers=1, capacity_factor=0.0, moe_dispatch="expert_parallel"
)


def learner_config() -> LearnerConfig:
    """SAO: one DIS policy step and two critic steps per iteration, no warm-up."""
    return dataclasses.replace(
        LearnerConfig(),
        policy_optimizer=OptimizerConfig(learning_rate=1e-3),
        critic_optimizer=OptimizerConfig(learning_rate=1e-3),
        critic=CriticConfig(steps=2, warmup_steps=0),
    )


def write_episodes(path: Path) -> None:
    """Multi-turn episodes, rollout log-probs near a random policy's, reward on 3 of 8."""
    write_store(
        path,
        [
            episode(f"e{i}", seed=i, reward=float(i % 3 == 0), logprob_scale=2.0)
            for i in range(EPISODES)
        ],
    )


def make_loader(store):
    return loader(store, rows=ROWS, seq_len=SEQ_LEN)


def shard_batch(store, index: int, count: int) -> dict:
    """The first batch of shard `index` of `count` (what process `index` reads)."""
    options = grain.sharding.ShardOptions(shard_index=index, shard_count=count)
    return next(iter(make_loader(store).epoch(shuffle=False, shard=options)))


__all__ = ["TENANT", "shard_batch"]
