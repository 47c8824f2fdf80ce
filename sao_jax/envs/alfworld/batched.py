"""Many games stepped together, with per-task-type success statistics.

Each step of our engine costs tens of microseconds, so a plain loop over in-process games
keeps up with a batched policy; no worker processes are needed.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from sao_jax.envs.alfworld.env import AlfworldEnv, GameSampler
from sao_jax.envs.alfworld.game import TASK_TYPES


class BatchedAlfworldEnv:
    """`num_envs` `AlfworldEnv`s drawing distinct games from one shared `GameSampler`.

    step(commands): one command per env; `None` leaves that env untouched (its last
    observation and info come back with reward 0 and `info["stepped"] = False`). A command
    for a finished env is an error unless `auto_reset`, which restarts finished envs inside
    `step`: the returned observation/info are then the new episode's, done is True for the
    step that ended, and `info["final_observation"]` / `info["episode"]` describe the old one.
    `expert`: which expert `expert_actions()` asks ("search" or "oracle", see `AlfworldEnv`).
    """

    def __init__(
        self,
        num_envs: int,
        split: str = "train",
        *,
        size: str = "full",
        phrasing: str = "0.4.2",
        max_steps: int = 50,
        seed: int = 0,
        indices: Sequence[int] | None = None,
        include_help: bool = False,
        expert_in_info: bool = False,
        auto_reset: bool = False,
        expert: str = "search",
    ):
        if not isinstance(num_envs, int) or num_envs < 1:
            raise ValueError(f"num_envs must be a positive int, got {num_envs!r}")
        self.sampler = GameSampler(split, seed=seed, indices=indices)
        self.envs = [
            AlfworldEnv(
                split,
                size=size,
                phrasing=phrasing,
                max_steps=max_steps,
                include_help=include_help,
                expert_in_info=expert_in_info,
                sampler=self.sampler,
                expert=expert,
            )
            for _ in range(num_envs)
        ]
        self.auto_reset = auto_reset
        self._observations = [""] * num_envs
        self._infos: list[dict] = [{} for _ in range(num_envs)]
        self._episodes = {task_type: [0, 0] for task_type in TASK_TYPES}  # [episodes, won]

    @property
    def num_envs(self) -> int:
        return len(self.envs)

    def reset(self, env_ids: Sequence[int] | None = None) -> tuple[list[str], list[dict]]:
        """Start new games in `env_ids` (default all); returns every env's observation and info."""
        for e in range(self.num_envs) if env_ids is None else env_ids:
            self._observations[e], self._infos[e] = self.envs[e].reset()
        return list(self._observations), list(self._infos)

    def step(
        self, commands: Sequence[str | None]
    ) -> tuple[list[str], np.ndarray, np.ndarray, list[dict]]:
        """Step every env with its command.

        Returns observations [N], rewards [N] float32, dones [N] bool, infos [N].
        """
        if len(commands) != self.num_envs:
            raise ValueError(f"got {len(commands)} commands for {self.num_envs} envs")
        rewards = np.zeros(self.num_envs, np.float32)
        dones = np.zeros(self.num_envs, bool)
        infos: list[dict] = []
        for e, (env, command) in enumerate(zip(self.envs, commands, strict=True)):
            if command is None:
                dones[e] = env.done
                infos.append({**self._infos[e], "stepped": False})
                continue
            if env.done:
                raise ValueError(f"env {e} has finished its episode: reset it or pass None")
            observation, rewards[e], dones[e], info = env.step(command)
            info["stepped"] = True
            if dones[e]:
                episode = info["episode"]
                self._episodes[episode["task_type"]][0] += 1
                self._episodes[episode["task_type"]][1] += int(episode["won"])
                if self.auto_reset:
                    final_observation = observation
                    observation, new_info = env.reset()
                    info = {**new_info, "stepped": True, "episode": episode}
                    info["final_observation"] = final_observation
            self._observations[e], self._infos[e] = observation, info
            infos.append(info)
        return list(self._observations), rewards, dones, infos

    def expert_actions(self) -> list[str | None]:
        """The expert's next command in every env (None where won or finished)."""
        return [None if env.done else env.expert_action() for env in self.envs]

    def success_by_task_type(self) -> dict[str, dict[str, float]]:
        """{task type or "all": {episodes, won, success_rate}} over finished episodes."""
        stats = {}
        for task_type, (episodes, won) in self._episodes.items():
            stats[task_type] = _rate(episodes, won)
        stats["all"] = _rate(
            sum(e for e, _ in self._episodes.values()), sum(w for _, w in self._episodes.values())
        )
        return stats


def _rate(episodes: int, won: int) -> dict[str, float]:
    return {"episodes": episodes, "won": won, "success_rate": won / episodes if episodes else 0.0}
