"""The LLM-agent harness of verl-agent / GiGPO / SEED papers as an env: `AlfworldHarness`
speaks to an `AlfworldEnv` in prompts and model replies (a `PromptedEnv`; the prompt renderer
and the reply parser live in `alfworld.prompts` and `envs.base`, re-exported here).
"""

from __future__ import annotations

from sao_jax.envs.alfworld.env import AlfworldEnv
from sao_jax.envs.alfworld.prompts import (
    ACTION_INSTRUCTIONS,
    SYSTEM_LINE,
    THINK_INSTRUCTIONS,
    compact_actions_line,
    observation_text,
    render_prompt,
)
from sao_jax.envs.base import PROMPT_STYLES, ParsedReply, check_prompt_style, parse_reply
from sao_jax.envs.prompted import HarnessConfig, PromptedEnv

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


class AlfworldHarness(PromptedEnv):
    """An `AlfworldEnv` spoken to in prompts and model replies (`PromptedEnv`).

    reset() -> (prompt, info); step(reply) -> (prompt, reward, done, info). A malformed reply
    sends an empty command (the engine answers "Nothing happens." and the step counts). Info
    adds `reply` (the ParsedReply), `invalid_replies` (count this episode) and `history`.
    """

    def __init__(self, env: AlfworldEnv, config: HarnessConfig | None = None):
        if not isinstance(env, AlfworldEnv):
            raise TypeError(f"AlfworldHarness needs an AlfworldEnv, got {type(env).__name__}")
        super().__init__(env, config or HarnessConfig())
