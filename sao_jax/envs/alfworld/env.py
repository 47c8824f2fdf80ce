"""The single-game environment rollouts use: `reset() -> (obs, info)`, `step(cmd) -> (obs, r, done, info)`.

`AlfworldEnv` is ALFWorld's `TextEnv` (`sao_jax.envs.base`), registered as "alfworld".
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from sao_jax.envs.alfworld.engine import AlfworldEngine
from sao_jax.envs.alfworld.expert import expert_action
from sao_jax.envs.alfworld.game import TASK_TYPES, Game
from sao_jax.envs.alfworld.generator import SPLITS, check_game_args, make_game
from sao_jax.envs.alfworld.prompts import ALFWORLD_PROMPTS
from sao_jax.envs.alfworld.search_expert import search_expert_action
from sao_jax.envs.alfworld.vocabulary import vocabulary
from sao_jax.envs.base import TaskSampler, TextEnv

EXPERTS = ("search", "oracle")


def check_expert(expert: str) -> str:
    """Return `expert` or raise a ValueError that lists the expert kinds."""
    if expert not in EXPERTS:
        raise ValueError(
            f'unknown expert {expert!r}; expected one of {EXPERTS} ("search": acts only on the '
            'transcript, "oracle": the planner that reads the true world state)'
        )
    return expert


class GameSampler(TaskSampler):
    """Endless, reproducible stream of game indices: each epoch is a fresh stable permutation.

    Several envs sharing one sampler draw distinct games until the split is exhausted.
    """

    def __init__(
        self, split: str = "train", *, seed: int = 0, indices: Sequence[int] | None = None
    ):
        check_game_args(split, 0, "full")
        for index in indices or ():
            check_game_args(split, index, "full")
        if indices is not None and not indices:
            raise ValueError("GameSampler needs at least one game index")
        super().__init__(split, SPLITS[split], seed=seed, indices=indices)


class AlfworldEnv(TextEnv):
    """One ALFWorld game at a time, on our engine.

    Rewards: 1.0 on the step that wins, else 0.0. An episode ends when won or after
    `max_steps` steps (a command that is not admissible prints "Nothing happens." and still
    costs a step).

    Info (reset and step): task, task_type, game_id (also as task_id), admissible_commands,
    won, steps; on step
    also `admissible` (whether the command was); with `expert_in_info`, the expert's next
    command as `expert_action` (None once won); when the episode ends, `episode` =
    {won, steps, task_type, game_id}.

    expert: which expert `expert_action()` asks: "search" (default; decides only from the
      episode's transcript -- the opening and every (command, observation) pair, kept in
      `transcript` -- like a policy that reads the texts) or "oracle" (the planner that reads
      the true world state: upper bounds and tests, not a teacher for a text-only policy).
    """

    name = "alfworld"
    splits = SPLITS
    experts = EXPERTS
    task_types = TASK_TYPES
    harness = ALFWORLD_PROMPTS

    def __init__(
        self,
        split: str = "train",
        *,
        size: str = "full",
        phrasing: str = "0.4.2",
        max_steps: int = 50,
        seed: int = 0,
        indices: Sequence[int] | None = None,
        include_help: bool = False,
        expert_in_info: bool = False,
        sampler: TaskSampler | None = None,
        expert: str = "search",
    ):
        check_game_args(split, 0, size)
        self.expert = check_expert(expert)
        if not isinstance(max_steps, int) or max_steps < 1:
            raise ValueError(f"max_steps must be a positive int, got {max_steps!r}")
        if sampler is not None and sampler.split != split:
            raise ValueError(f"sampler draws from {sampler.split!r} but the env plays {split!r}")
        self.split, self.size, self.phrasing = split, size, phrasing
        self.max_steps = max_steps
        self.include_help = include_help
        self.expert_in_info = expert_in_info
        self.sampler = sampler or GameSampler(split, seed=seed, indices=indices)
        self.engine: AlfworldEngine | None = None
        self.steps = 0
        self.done = True
        self.opening = ""
        self.transcript: list[tuple[str, str]] = []  # (command, observation) per step

    @classmethod
    def from_config(cls, config, sampler: TaskSampler) -> AlfworldEnv:
        """The env of an `EnvConfig` (split, size, phrasing, max_steps, expert)."""
        return cls(
            config.split,
            size=config.size,
            phrasing=config.phrasing,
            max_steps=config.max_steps,
            sampler=sampler,
            expert=config.expert,
        )

    @classmethod
    def from_task_spec(cls, spec: Mapping, *, expert: str | None = None) -> AlfworldEnv:
        """The env of a stored episode's `header.task` (split, size, phrasing, max_steps)."""
        return cls(
            spec["split"],
            size=spec.get("size", "full"),
            phrasing=spec.get("phrasing", "0.4.2"),
            max_steps=int(spec.get("max_steps", 50)),
            expert=expert or EXPERTS[0],
        )

    @classmethod
    def vocabulary(cls) -> list[str]:
        """`alfworld.vocabulary.vocabulary()`: every word of its texts, numbers up to 100."""
        return vocabulary()

    def task_spec(self) -> dict:
        """size and phrasing (split, index and max_steps the episode records itself)."""
        return {"size": self.size, "phrasing": self.phrasing}

    @property
    def game(self) -> Game:
        if self.engine is None:
            raise RuntimeError("no game yet: call reset() first")
        return self.engine.game

    def reset(self, index: int | None = None, *, game: Game | None = None) -> tuple[str, dict]:
        """Start a game: `game` if given, else game `index` of the split, else the next one."""
        if game is None:
            index = self.sampler.next_index() if index is None else index
            game = make_game(self.split, index, size=self.size)
        self.engine = AlfworldEngine(game, phrasing=self.phrasing, include_help=self.include_help)
        observation = self.engine.reset()
        self.opening, self.transcript = observation, []
        self.steps, self.done = 0, False
        return observation, self._info()

    def step(self, command: str) -> tuple[str, float, bool, dict]:
        """Run one command; see the class docstring for rewards and info."""
        if self.done or self.engine is None:
            raise RuntimeError("episode is over: call reset() first")
        admissible = self.engine.is_admissible(command)
        observation = self.engine.step(command)
        self.transcript.append((command, observation))
        self.steps += 1
        won = self.engine.won
        self.done = won or self.steps >= self.max_steps
        info = self._info()
        info["admissible"] = admissible
        if self.done:
            game = self.engine.game
            info["episode"] = {
                "won": won,
                "steps": self.steps,
                "task_type": game.task.task_type,
                "game_id": game.game_id,
            }
        return observation, float(won), self.done, info

    def expert_action(self) -> str | None:
        """The expert's next command from the current state (None once won)."""
        if self.engine is None:
            raise RuntimeError("no game yet: call reset() first")
        if self.expert == "oracle":
            return expert_action(self.engine)
        return search_expert_action(
            self.opening, self.transcript, phrasing=self.phrasing, won=self.engine.won
        )

    def _info(self) -> dict:
        engine = self.engine
        info = {
            "task": engine.game.task.sentence,
            "task_type": engine.game.task.task_type,
            "game_id": engine.game.game_id,
            "task_id": engine.game.game_id,
            "admissible_commands": engine.admissible_commands,
            "won": engine.won,
            "steps": self.steps,
        }
        if self.expert_in_info:
            info["expert_action"] = self.expert_action()
        return info
