"""Registered environments by name, and `EnvConfig`, which builds any of them.

The built-in envs ("alfworld", "arithmetic") are imported on first use; add your own with
`register_env(MyEnv)` (a `TextEnv` subclass), then `EnvConfig(name="my_env", ...)` builds it
everywhere a config names an env (rollout engine, evaluation, expert demos).
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Mapping, Sequence

from sao_jax.envs.base import TaskSampler, TextEnv, check_replay

# Imported lazily: each env's modules import the protocol, not the other way round.
_BUILTIN = {
    "alfworld": ("sao_jax.envs.alfworld.env", "AlfworldEnv"),
    "arithmetic": ("sao_jax.envs.arithmetic.env", "ArithmeticEnv"),
}
_REGISTRY: dict[str, type[TextEnv]] = {}


def register_env(cls: type[TextEnv]) -> type[TextEnv]:
    """Register a `TextEnv` subclass under `cls.name` (usable as a class decorator).

    A name already taken by another class is a ValueError; registering the same class twice
    is harmless.
    """
    if not (isinstance(cls, type) and issubclass(cls, TextEnv)):
        raise TypeError(f"register_env needs a TextEnv subclass, got {cls!r}")
    name = getattr(cls, "name", "")
    if not isinstance(name, str) or not name:
        raise ValueError(f"{cls.__name__}.name must be a non-empty string")
    for attribute in ("splits", "experts", "harness"):
        if not hasattr(cls, attribute):
            raise ValueError(f"{cls.__name__} has no class attribute {attribute!r}")
    if not cls.splits or not cls.experts:
        raise ValueError(f"{cls.__name__} needs at least one split and one expert")
    known = _REGISTRY.get(name)
    if known is not None and known is not cls:
        raise ValueError(f"env name {name!r} is taken by {known.__module__}.{known.__name__}")
    if name in _BUILTIN and known is None and _builtin_path(cls) != _BUILTIN[name]:
        raise ValueError(f"env name {name!r} is a built-in env's")
    _REGISTRY[name] = cls
    return cls


def env_names() -> tuple[str, ...]:
    """Every env name `env_class` accepts (built-in and registered)."""
    return tuple(sorted({*_BUILTIN, *_REGISTRY}))


def env_class(name: str) -> type[TextEnv]:
    """The `TextEnv` subclass registered as `name` (a built-in is imported on first use)."""
    if name not in _REGISTRY and name in _BUILTIN:
        module, attribute = _BUILTIN[name]
        register_env(getattr(importlib.import_module(module), attribute))
    if name not in _REGISTRY:
        raise ValueError(f"unknown env {name!r}; expected one of {env_names()}")
    return _REGISTRY[name]


def env_from_task_spec(spec: Mapping, *, expert: str | None = None) -> TextEnv:
    """An env that replays the episode whose `header.task` is `spec` (reset it with
    `spec["index"]`); episodes written before envs were named are ALFWorld's."""
    return env_class(str(spec.get("env", "alfworld"))).from_task_spec(spec, expert=expert)


def _builtin_path(cls: type) -> tuple[str, str]:
    return cls.__module__, cls.__name__


@dataclasses.dataclass(frozen=True)
class EnvConfig:
    """Which environment's tasks are played and how.

    Attributes:
      split: the split tasks are drawn from (one of the env's `splits`).
      size: (ALFWorld only) "small" or "full" rooms; other envs ignore it.
      phrasing: (ALFWorld only) the engine's message wording ("0.4.2"); other envs ignore it.
      max_steps: steps per episode (a malformed reply costs one).
      seed: the task stream's seed (each epoch a fresh permutation of the split).
      expert: which expert demos and DAgger relabelling ask (`env.expert_action()`), one of
        the env's `experts`. ALFWorld: "search" (acts only on the episode's texts, so a
        text-only policy can imitate it) or "oracle" (the planner that reads the true world
        state; upper bounds and tests). Arithmetic: "search" (solves the task text).
      name: the env ("alfworld", "arithmetic" or one added with `register_env`).
      replay_failed: the probability that a draw of the task stream replays a failed task
        instead of a fresh one (0: off, the default); see `TaskSampler`. Applies to every
        endless stream the rollout engine plays (RL, critic warm-up, DAgger rounds, SEED's
        play), not to evaluation's fixed games.
      replay_limit: how many times a failed task is replayed before it is dropped (a win
        resets its count).
    """

    split: str = "train"
    size: str = "small"
    phrasing: str = "0.4.2"
    max_steps: int = 50
    seed: int = 0
    expert: str = "search"
    name: str = "alfworld"
    replay_failed: float = 0.0
    replay_limit: int = 2

    def __post_init__(self):
        cls = env_class(self.name)
        check_replay(self.replay_failed, self.replay_limit)
        if self.expert not in cls.experts:
            raise ValueError(
                f"EnvConfig.expert must be one of {cls.experts} for {self.name!r}, "
                f"got {self.expert!r}"
            )
        if self.split not in cls.splits:
            raise ValueError(
                f"unknown split {self.split!r} of {self.name!r}; expected one of "
                f"{tuple(cls.splits)}"
            )
        if not isinstance(self.max_steps, int) or self.max_steps < 1:
            raise ValueError(f"EnvConfig.max_steps must be a positive int, got {self.max_steps!r}")

    @property
    def env_class(self) -> type[TextEnv]:
        return env_class(self.name)

    def make_envs(self, num_envs: int, *, indices: Sequence[int] | None = None) -> list[TextEnv]:
        """`num_envs` envs sharing one task stream (distinct tasks until the split runs out).

        indices: the task indices to draw from (None: the whole split)."""
        if not isinstance(num_envs, int) or num_envs < 1:
            raise ValueError(f"num_envs must be a positive int, got {num_envs!r}")
        cls = self.env_class
        sampler = TaskSampler(
            self.split,
            cls.splits[self.split],
            seed=self.seed,
            indices=indices,
            replay_failed=self.replay_failed,
            replay_limit=self.replay_limit,
        )
        return [cls.from_config(self, sampler) for _ in range(num_envs)]
