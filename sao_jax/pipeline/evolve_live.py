"""Live windows of an evolution run: each tenant's agent plays its games through the gateway.

`WindowAgent` is the online agent (`sao_jax.pipeline.online_agent.Agent`: the official `openai`
client, one gateway session per game, rewards on `/rl/set_reward`, `/rl/end_session` with the
outcome) playing a fixed list of games once each, then stopping: a deployment whose tasks recur
plays the same games every round, so a round's window measures the composite it ran under.
"""

from __future__ import annotations

import dataclasses
import queue
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from sao_jax.pipeline.online_agent import Agent, AgentConfig


class WindowAgent(Agent):
    """Plays each game of `games` once on `config.concurrency` threads, then stops."""

    def __init__(self, config: AgentConfig, admin_key: str, games: Sequence[int], **kwargs):
        super().__init__(config, admin_key, **kwargs)
        self.games_left: queue.SimpleQueue[int] = queue.SimpleQueue()
        for game in games:
            self.games_left.put(int(game))
        self.records: list[dict[str, Any]] = []

    def next_game(self) -> int | None:
        try:
            return self.games_left.get_nowait()
        except queue.Empty:
            return None

    def episode_seed(self, game: int, thread_index: int, played: int) -> int:
        """The same seed per game, whichever thread plays it: a sampled window is
        reproducible."""
        return self.config.seed * 1_000_003 + game * 7_919

    def play_episode(self, game: int, seed: int) -> dict[str, Any] | None:
        record = super().play_episode(game, seed)
        if record is not None:
            self.records.append(record)
        return record


def tenant_games(num_tenants: int, games: int, split_size: int, seed: int) -> list[list[int]]:
    """Disjoint lists of `games` games of the split per tenant (a seeded permutation)."""
    if num_tenants * games > split_size:
        raise ValueError(
            f"{num_tenants} tenants x {games} games do not fit the {split_size} games of the split"
        )
    order = np.random.default_rng(seed).permutation(split_size)
    return [sorted(order[k * games : (k + 1) * games].tolist()) for k in range(num_tenants)]


@dataclasses.dataclass(frozen=True)
class Window:
    """One tenant's live window: when it began, its games and outcomes."""

    tenant: str
    began: float
    seconds: float
    records: tuple[dict[str, Any], ...]
    errors: int

    @property
    def success(self) -> float:
        return sum(r["won"] for r in self.records) / max(len(self.records), 1)


def play_window(
    config: AgentConfig, admin_key: str, games: Sequence[int], log_path: Path
) -> Window:
    """Play `games` once each as `config.tenant` through the gateway at `config.url`."""
    began = time.time()
    agent = WindowAgent(config, admin_key, games, log_path=log_path)
    stats = agent.run()
    if agent.failed:
        raise RuntimeError(f"the {config.tenant} agent gave up: {stats['last_error']}")
    return Window(config.tenant, began, time.time() - began, tuple(agent.records), stats["errors"])
