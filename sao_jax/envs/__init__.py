"""Environments agents act in (text games); each returns text observations and rewards.

`base` is the protocol every env implements (`TextEnv`, `PromptHarness`); `registry` builds
any registered env from an `EnvConfig`; `PromptedEnv` speaks to one in prompts and replies.
Built-in: `alfworld`, `arithmetic`.
"""

from sao_jax.envs.base import (
    ParsedReply,
    PromptHarness,
    PromptOptions,
    RewardWeights,
    TaskSampler,
    TextEnv,
    parse_reply,
)
from sao_jax.envs.prompted import PromptedEnv
from sao_jax.envs.registry import (
    EnvConfig,
    env_class,
    env_from_task_spec,
    env_names,
    register_env,
)

__all__ = [
    "EnvConfig",
    "ParsedReply",
    "PromptHarness",
    "PromptOptions",
    "PromptedEnv",
    "RewardWeights",
    "TaskSampler",
    "TextEnv",
    "env_class",
    "env_from_task_spec",
    "env_names",
    "parse_reply",
    "register_env",
]
