"""The LLM-agent harness of verl-agent / GiGPO / SEED papers as an env: `AlfworldHarness`
speaks to an `AlfworldEnv` in prompts and model replies (a `PromptedEnv`; the prompt renderer
and the reply parser live in `alfworld.prompts` and `envs.base`, re-exported here).
"""

from __future__ import annotations

import dataclasses

from sao_jax.envs.alfworld.env import AlfworldEnv
from sao_jax.envs.alfworld.prompts import (
    ACTION_INSTRUCTIONS,
    SYSTEM_LINE,
    THINK_INSTRUCTIONS,
    compact_actions_line,
    observation_text,
    render_prompt,
)
from sao_jax.envs.base import (
    PROMPT_STYLES,
    ParsedReply,
    PromptOptions,
    RewardWeights,
    check_prompt_style,
    parse_reply,
)
from sao_jax.envs.prompted import PromptedEnv

__all__ = [
    "ACTION_INSTRUCTIONS",
    "PROMPT_STYLES",
    "SYSTEM_LINE",
    "THINK_INSTRUCTIONS",
    "AlfworldHarness",
    "HarnessConfig",
    "ParsedReply",
    "check_prompt_style",
    "compact_actions_line",
    "observation_text",
    "parse_reply",
    "render_prompt",
]


@dataclasses.dataclass(frozen=True)
class HarnessConfig:
    """Prompt and reward settings (papers: h=2, 10 x won, -0.1 per malformed reply).

    memory_line: add a line under the task with what the episode has seen beyond the window
      (`search_expert.memory_line`: receptacles looked into, with the task's objects in them).
    prompt_style: "paper" or "compact" (`render_prompt`).
    """

    history_length: int = 2
    think: bool = True
    memory_line: bool = False
    prompt_style: str = "paper"
    win_reward: float = 10.0
    invalid_reply_penalty: float = -0.1


class AlfworldHarness(PromptedEnv):
    """An `AlfworldEnv` spoken to in prompts and model replies (`PromptedEnv`).

    reset() -> (prompt, info); step(reply) -> (prompt, reward, done, info). A malformed reply
    sends an empty command (the engine answers "Nothing happens." and the step counts). Info
    adds `reply` (the ParsedReply), `invalid_replies` (count this episode) and `history`.
    """

    def __init__(self, env: AlfworldEnv, config: HarnessConfig | None = None):
        if not isinstance(env, AlfworldEnv):
            raise TypeError(f"AlfworldHarness needs an AlfworldEnv, got {type(env).__name__}")
        config = config or HarnessConfig()
        self.config = config
        options = PromptOptions(
            config.history_length, config.think, config.memory_line, config.prompt_style
        )
        super().__init__(
            env, options, RewardWeights(config.win_reward, config.invalid_reply_penalty)
        )
