"""The LLM-agent harness of verl-agent / GiGPO / SEED papers: prompt renderer and reply parser.

The prompt gives the task, the step count, the last `history_length` observation/action pairs,
the current observation and the admissible actions, and asks for reasoning in
`<think>...</think>` (optional here, for small models) and the action in
`<action>...</action>`. A malformed reply is an invalid step: it is counted, penalised and
costs a step, and the episode goes on.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence

from sao_jax.envs.alfworld import texts
from sao_jax.envs.alfworld.env import AlfworldEnv
from sao_jax.envs.alfworld.search_expert import memory_line

SYSTEM_LINE = "You are an expert agent operating in the ALFRED Embodied Environment."
THINK_INSTRUCTIONS = (
    "You should first reason step-by-step about the current situation. This reasoning process "
    "MUST be enclosed within <think> </think> tags.\n"
    "Once you've finished your reasoning, you should choose an admissible action for current "
    "step and present it within <action> </action> tags."
)
ACTION_INSTRUCTIONS = "Choose an admissible action for the current step and present it within <action> </action> tags."
_ACTION_BLOCK = re.compile(r"<action>(.*?)</action>", re.DOTALL | re.IGNORECASE)
_THINK_BLOCK = re.compile(r"<think>(.*?)</think>", re.DOTALL | re.IGNORECASE)


def observation_text(observation: str) -> str:
    """The observation as the prompt shows it: the opening loses its banner and task line."""
    if observation.startswith(texts.WELCOME):
        observation = observation[len(texts.WELCOME) :].split("\n\nYour task is to: ")[0]
    return observation.strip()


def render_prompt(
    task: str,
    observation: str,
    admissible: Sequence[str],
    *,
    history: Sequence[tuple[str, str]] = (),
    step: int = 0,
    history_length: int = 2,
    think: bool = True,
    memory: str | None = None,
    style: str = "paper",
) -> str:
    """The user prompt for one turn.

    Args:
      task: the task sentence ("put a clean mug in cabinet").
      observation: the current observation (raw engine text is fine).
      admissible: the admissible commands now.
      history: every earlier (observation, action) pair of the episode, oldest first; the last
        `history_length` are shown.
      step: steps taken so far.
      history_length: h, how many past pairs to show (0: none).
      think: ask for `<think>` reasoning before the action.
      memory: an optional line shown under the task (e.g. `search_expert.memory_line`: what
        the episode has seen beyond the window); None: none.
      style: "paper" (the verl-agent / GiGPO / SEED wording) or "compact": the same facts
        (task, step, the last h pairs, observation, admissible actions) without the system
        line, the framing sentences and the reply instructions -- about 40% fewer tokens, for
        a model trained from scratch, which learns the reply format from demonstrations.
    """
    if history_length < 0:
        raise ValueError(f"history_length must be >= 0, got {history_length}")
    check_prompt_style(style)
    if style == "compact":
        return _compact_prompt(task, observation, admissible, history, step, history_length, memory)
    lines = [f"{SYSTEM_LINE} Your task is to: {task}."]
    if memory:
        lines.append(memory)
    shown = list(history)[max(0, len(history) - history_length) :] if history_length else []
    if step > 0 and shown:
        first = len(history) - len(shown) + 1
        pairs = " ".join(
            f"[Observation {first + k}: '{observation_text(obs)}', Action {first + k}: '{action}']"
            for k, (obs, action) in enumerate(shown)
        )
        lines.append(
            f"Prior to this step, you have already taken {step} step(s). Below are the most "
            f"recent {len(shown)} observations and the corresponding actions you took: {pairs}"
        )
        lines.append(
            f"You are now at step {step + 1} and your current observation is: "
            f"{observation_text(observation)}"
        )
    else:
        lines.append(f"Your current observation is: {observation_text(observation)}")
    actions = ", ".join(f"'{command}'" for command in admissible)
    lines.append(f"Your admissible actions of the current situation are: [{actions}].")
    lines.append("")
    lines.append("Now it's your turn to take an action.")
    lines.append(THINK_INSTRUCTIONS if think else ACTION_INSTRUCTIONS)
    return "\n".join(lines)


PROMPT_STYLES = ("paper", "compact")


def check_prompt_style(style: str) -> None:
    """A ValueError naming the known styles for any other."""
    if style not in PROMPT_STYLES:
        raise ValueError(f"prompt style must be one of {PROMPT_STYLES}, got {style!r}")


def compact_actions_line(admissible: Sequence[str]) -> str:
    """The compact prompt's last line (also the end of a compact concat turn)."""
    return f"Your admissible actions are: {', '.join(admissible)}."


def _compact_prompt(task, observation, admissible, history, step, history_length, memory) -> str:
    # The anchors SEED's records read stay: "Your task is to: X." ends a line, and the
    # observation runs from "current observation is: " to the line "Your admissible ...".
    lines = [f"Your task is to: {task}."]
    if memory:
        lines.append(memory)
    shown = list(history)[max(0, len(history) - history_length) :] if history_length else []
    if step > 0:
        first = len(history) - len(shown) + 1
        pairs = " ".join(
            f"Observation {first + k}: {observation_text(obs)} Action {first + k}: {action}."
            for k, (obs, action) in enumerate(shown)
        )
        lines.append(f"Step {step + 1}. {pairs}".rstrip())
    lines.append(f"Your current observation is: {observation_text(observation)}")
    lines.append(compact_actions_line(admissible))
    return "\n".join(lines)


@dataclasses.dataclass(frozen=True)
class ParsedReply:
    """A parsed model reply. `action` is normalised (lower case, single spaces)."""

    action: str | None
    valid: bool
    error: str | None = None
    thought: str | None = None


def parse_reply(reply: str, *, think: bool = True) -> ParsedReply:
    """Extract the action from `...<think>...</think>...<action>...</action>`.

    Malformed (valid=False, with an error naming the problem): no or several `<action>`
    blocks, an empty action, and with `think`, a missing, repeated or misplaced `<think>`.
    """
    actions = _ACTION_BLOCK.findall(reply)
    if not actions:
        return ParsedReply(None, False, "no <action>...</action> block")
    if len(actions) > 1:
        return ParsedReply(None, False, f"{len(actions)} <action> blocks; expected exactly one")
    action = " ".join(actions[0].split()).strip("'\"`").strip().lower()
    if not action:
        return ParsedReply(None, False, "empty <action> block")
    thought = None
    if think:
        thoughts = list(_THINK_BLOCK.finditer(reply))
        if len(thoughts) != 1:
            return ParsedReply(
                action, False, f"{len(thoughts)} <think> blocks; expected exactly one"
            )
        if thoughts[0].start() > _ACTION_BLOCK.search(reply).start():
            return ParsedReply(action, False, "<think> must come before <action>")
        thought = thoughts[0].group(1).strip()
    return ParsedReply(action, True, None, thought)


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
