"""The LLM-agent harness of verl-agent / GiGPO / SEED papers as an env: `AlfworldHarness`
speaks to an `AlfworldEnv` in prompts and model replies (the prompt renderer and the reply
parser live in `alfworld.prompts` and `envs.base`, re-exported here).
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
from sao_jax.envs.alfworld.search_expert import memory_line
from sao_jax.envs.base import PROMPT_STYLES, ParsedReply, check_prompt_style, parse_reply

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


class AlfworldHarness:
    """An `AlfworldEnv` spoken to in prompts and model replies.

    reset() -> (prompt, info); step(reply) -> (prompt, reward, done, info). A malformed reply
    sends an empty command (the engine answers "Nothing happens." and the step counts). Info
    adds `reply` (the ParsedReply), `invalid_replies` (count this episode) and `history`.
    """

    def __init__(self, env: AlfworldEnv, config: HarnessConfig = HarnessConfig()):
        self.env, self.config = env, config
        self.history: list[tuple[str, str]] = []
        self.invalid_replies = 0
        self._observation, self._info = "", {}

    def reset(self, index: int | None = None) -> tuple[str, dict]:
        self._observation, self._info = self.env.reset(index)
        self.history, self.invalid_replies = [], 0
        return self.prompt(), self._with_harness_info(self._info, None)

    def prompt(self) -> str:
        """The prompt for the current turn."""
        return render_prompt(
            self._info["task"],
            self._observation,
            self._info["admissible_commands"],
            history=self.history,
            step=len(self.history),
            history_length=self.config.history_length,
            think=self.config.think,
            style=self.config.prompt_style,
            memory=(
                memory_line(self.env.opening, self.env.transcript)
                if self.config.memory_line
                else None
            ),
        )

    def step(self, reply: str) -> tuple[str, float, bool, dict]:
        parsed = parse_reply(reply, think=self.config.think)
        command = parsed.action if parsed.valid else ""
        self.invalid_replies += not parsed.valid
        self.history.append((self._observation, command))
        self._observation, won_reward, done, self._info = self.env.step(command)
        reward = self.config.win_reward * won_reward
        if not parsed.valid:
            reward += self.config.invalid_reply_penalty
        return self.prompt(), reward, done, self._with_harness_info(self._info, parsed)

    def _with_harness_info(self, info: dict, parsed: ParsedReply | None) -> dict:
        return {
            **info,
            "reply": parsed,
            "invalid_replies": self.invalid_replies,
            "history": list(self.history),
        }
