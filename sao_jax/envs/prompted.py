"""Any `TextEnv` spoken to in prompts and model replies (a served agent, an online loop).

`PromptedEnv.reset()` returns the first prompt (the env harness's text, no chat markers);
`step(reply)` parses the reply, steps the env with its action (an empty one for a malformed
reply: it still costs a step) and returns the next prompt and the turn's reward.
"""

from __future__ import annotations

from sao_jax.envs.base import (
    ParsedReply,
    PromptOptions,
    RewardWeights,
    TextEnv,
    repeated_turn,
)


class PromptedEnv:
    """A `TextEnv` spoken to in prompts and model replies, through its class's harness.

    reset(index) -> (prompt, info); step(reply) -> (prompt, reward, done, info); the reward is
    the env's reward hook (`TextEnv.rewards`) under `weights`. Info adds `reply` (the
    ParsedReply), `invalid_replies` (count this episode) and `history` (every
    (observation, action) pair so far); after a step also the reward's two parts,
    `env_reward` and `format_reward` (the malformed-reply or refused-command penalty), and
    `repeated_observation` (a well-formed, admitted command whose answer the episode had
    already seen: `repeated_turn`, what the rollout's novelty penalty falls on).
    options: how prompts are written (h, think, memory line, style; `PromptOptions`).
    """

    def __init__(
        self,
        env: TextEnv,
        options: PromptOptions | None = None,
        weights: RewardWeights | None = None,
    ):
        if not isinstance(env, TextEnv):
            raise TypeError(f"PromptedEnv needs a TextEnv, got {type(env).__name__}")
        self.env = env
        self.options, self.weights = options or PromptOptions(), weights or RewardWeights()
        self.harness = type(env).harness
        self.harness.check_options(self.options)
        self.history: list[tuple[str, str]] = []
        self.invalid_replies = 0
        self._observation, self._info = "", {}

    def reset(self, index: int | None = None) -> tuple[str, dict]:
        self._observation, self._info = self.env.reset(index)
        self.history, self.invalid_replies = [], 0
        return self.prompt(), self._with_harness_info(self._info, None)

    def prompt(self) -> str:
        """The prompt for the current turn."""
        info = self._info
        return self.harness.prompt(
            info["task"],
            self._observation,
            info["admissible_commands"],
            self.history,
            self.options,
        )

    def step(self, reply: str) -> tuple[str, float, bool, dict]:
        parsed = self.harness.parse_reply(reply, think=self.options.think)
        command = parsed.action if parsed.valid else ""
        self.invalid_replies += not parsed.valid
        given = self._observation
        self._observation, won_reward, done, self._info = self.env.step(command)
        admissible = bool(self._info["admissible"])
        env_reward, format_reward = self.env.rewards(
            won_reward, valid_reply=parsed.valid, admissible=admissible, weights=self.weights
        )
        repeated = repeated_turn(
            self._observation, given, self.history, valid_reply=parsed.valid, admissible=admissible
        )
        self.history.append((given, command))
        info = self._with_harness_info(self._info, parsed)
        info.update(
            env_reward=env_reward, format_reward=format_reward, repeated_observation=repeated
        )
        return self.prompt(), env_reward + format_reward, done, info

    def _with_harness_info(self, info: dict, parsed: ParsedReply | None) -> dict:
        return {
            **info,
            "reply": parsed,
            "invalid_replies": self.invalid_replies,
            "history": list(self.history),
        }
