"""The real ALFWorld engine (alfworld 0.4.2 on TextWorld's PDDL backend) behind our env API.

Plays `game.tw-pddl` files: ours from `export_tw_pddl`, or ALFWorld's released games for users
who have them (`ALFWORLD_DATA`, see `real_game_files`). Needs the `alfworld` extra.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from sao_jax.envs.alfworld.pddl_export import ALFWORLD_EXTRA_HINT

# ALFWorld's split folders under $ALFWORLD_DATA.
REAL_SPLIT_DIRS = {
    "train": "json_2.1.1/train",
    "valid_seen": "json_2.1.1/valid_seen",
    "valid_unseen": "json_2.1.1/valid_unseen",
}


def real_game_files(split: str, data_dir: str | os.PathLike | None = None) -> list[Path]:
    """ALFWorld's solvable `game.tw-pddl` files of a split, sorted, as alfworld collects them.

    data_dir defaults to $ALFWORLD_DATA. Skips movable/sliced trajectories and games marked
    unsolvable, like `AlfredTWEnv.collect_game_files`.
    """
    if split not in REAL_SPLIT_DIRS:
        raise ValueError(f"unknown split {split!r}; expected one of {tuple(REAL_SPLIT_DIRS)}")
    root = data_dir if data_dir is not None else os.environ.get("ALFWORLD_DATA")
    if not root:
        raise FileNotFoundError("no ALFWorld data: pass data_dir or set ALFWORLD_DATA")
    split_dir = Path(os.path.expandvars(str(root))) / REAL_SPLIT_DIRS[split]
    if not split_dir.is_dir():
        raise FileNotFoundError(f"ALFWorld split folder not found: {split_dir}")
    files = []
    for game_file in sorted(split_dir.rglob("game.tw-pddl")):
        folder = str(game_file.parent)
        if "movable" in folder or "Sliced" in folder:
            continue
        if json.loads(game_file.read_text()).get("solvable"):
            files.append(game_file)
    return files


class RealAlfworldEnv:
    """Same API as `AlfworldEnv`, played by the real engine.

    game_files: one or more `game.tw-pddl` files (or folders holding one); `reset()` plays them
      in order, cycling, unless given an index.
    include_help: keep `help` in the admissible commands (the real engine lists it; agent
      papers and our engine drop it by default).
    """

    def __init__(
        self,
        game_files: str | os.PathLike | Sequence[str | os.PathLike],
        *,
        max_steps: int = 50,
        include_help: bool = False,
    ):
        try:
            import textworld
            from alfworld.agents.environment.alfred_tw_env import AlfredDemangler, AlfredInfos
        except ModuleNotFoundError as error:
            raise ImportError(f"RealAlfworldEnv needs alfworld; {ALFWORLD_EXTRA_HINT}") from error
        if isinstance(game_files, (str, os.PathLike)):
            game_files = [game_files]
        self.game_files = [_game_file(path) for path in game_files]
        if not self.game_files:
            raise ValueError("RealAlfworldEnv needs at least one game file")
        self.max_steps = max_steps
        self.include_help = include_help
        self._textworld = textworld
        self._wrappers = (AlfredDemangler, AlfredInfos)
        self._env: Any = None
        self._loaded: int | None = None
        self._next = 0
        self._steps = 0
        self._done = True
        self._task = ""

    def reset(self, index: int | None = None) -> tuple[str, dict]:
        """Start game `index` (default: the next one); returns (observation, info)."""
        if index is None:
            index, self._next = self._next, (self._next + 1) % len(self.game_files)
        if index != self._loaded:
            self._load(index)
        state = _keeping_argv(self._env.reset)
        self._steps, self._done = 0, False
        obs = state.feedback
        self._task = obs.rsplit("Your task is to: ", 1)[-1].rstrip(".")
        return obs, self._info(state)

    def step(self, command: str) -> tuple[str, float, bool, dict]:
        """Run one command; reward 1.0 on the step that wins, episode ends at `max_steps`."""
        if self._done:
            raise RuntimeError("episode is over: call reset() first")
        state, _, _ = _keeping_argv(self._env.step, command)
        self._steps += 1
        won = bool(state["won"])
        self._done = won or self._steps >= self.max_steps
        return state.feedback, float(won), self._done, self._info(state)

    def close(self) -> None:
        if self._env is not None:
            self._env.close()
            self._env = None

    def _load(self, index: int) -> None:
        infos = self._textworld.EnvInfos(won=True, admissible_commands=True, extras=["gamefile"])
        demangler, add_infos = self._wrappers
        self.close()
        self._env = _keeping_argv(
            self._textworld.start,
            str(self.game_files[index]),
            infos,
            wrappers=[demangler(), add_infos],
        )
        self._loaded = index

    def _info(self, state: Any) -> dict:
        admissible = list(state["admissible_commands"])
        if not self.include_help and "help" in admissible:
            admissible.remove("help")
        return {
            "task": self._task,
            "admissible_commands": admissible,
            "won": bool(state["won"]),
            "steps": self._steps,
            "game_file": str(self.game_files[self._loaded]),
        }


def _game_file(path: str | os.PathLike) -> Path:
    path = Path(path)
    if path.is_dir():
        path = path / "game.tw-pddl"
    if not path.is_file():
        raise FileNotFoundError(f"no ALFWorld game file at {path}")
    return path


def _keeping_argv(fn: Any, *args: Any, **kwargs: Any) -> Any:
    # fast_downward's translator overwrites sys.argv while it parses a problem.
    argv = list(sys.argv)
    try:
        return fn(*args, **kwargs)
    finally:
        sys.argv = argv
