"""The LLM-agent prompts of the verl-agent / GiGPO / SEED papers for ALFWorld, and the
`PromptHarness` the rollout uses (`AlfworldPrompts`).

The prompt gives the task, the step count, the last `history_length` observation/action pairs,
the current observation and the admissible actions, and asks for reasoning in
`<think>...</think>` (optional here, for small models) and the action in
`<action>...</action>`. A malformed reply is an invalid step: it is counted, penalised and
costs a step, and the episode goes on.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Sequence

import sao_jax.envs.alfworld.texts as texts
from sao_jax.envs.alfworld.game import TASK_TEMPLATES
from sao_jax.envs.alfworld.search_expert import memory_line as episode_memory
from sao_jax.envs.base import PromptHarness, PromptOptions, check_prompt_style

SYSTEM_LINE = "You are an expert agent operating in the ALFRED Embodied Environment."
THINK_INSTRUCTIONS = (
    "You should first reason step-by-step about the current situation. This reasoning process "
    "MUST be enclosed within <think> </think> tags.\n"
    "Once you've finished your reasoning, you should choose an admissible action for current "
    "step and present it within <action> </action> tags."
)
ACTION_INSTRUCTIONS = "Choose an admissible action for the current step and present it within <action> </action> tags."


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


def followup_text(
    observation: str,
    admissible: Sequence[str],
    *,
    step: int,
    think: bool,
    style: str = "paper",
) -> str:
    """The user turn a concat episode appends after each step (the task is already above)."""
    if style == "compact":
        return "\n".join(
            [
                f"Step {step + 1}. Your current observation is: {observation_text(observation)}",
                compact_actions_line(admissible),
            ]
        )
    actions = ", ".join(f"'{command}'" for command in admissible)
    return "\n".join(
        [
            f"You are now at step {step + 1} and your current observation is: "
            f"{observation_text(observation)}",
            f"Your admissible actions of the current situation are: [{actions}].",
            "",
            "Now it's your turn to take an action.",
            THINK_INSTRUCTIONS if think else ACTION_INSTRUCTIONS,
        ]
    )


_TASK = re.compile(r"Your task is to: (.*?)\.\s*$", re.MULTILINE)
_OBSERVATION = re.compile(r"current observation is: (.*?)\n\s*Your admissible", re.DOTALL)
# Every task sentence of each type, objects and receptacles as single words (display names).
_TASK_SENTENCES = [
    (task_type, re.compile(re.escape(t).replace(r"\{obj\}", r"\w+").replace(r"\{recep\}", r"\w+")))
    for task_type, pair in TASK_TEMPLATES.items()
    for t in pair
]


class AlfworldPrompts(PromptHarness):
    """ALFWorld's `PromptHarness`: `render_prompt` for windowed turns and turn 0,
    `followup_text` for concat turns, the optional memory line (`search_expert.memory_line`,
    from the history alone), `<think>` / `<action>` replies."""

    name = "alfworld"
    memory_line = True

    def prompt(self, task, observation, admissible, history, options: PromptOptions) -> str:
        memory = None
        if options.memory_line:
            if history:
                # the transcript: the opening, then each command with the observation it got
                steps = [
                    (command, next_observation)
                    for (_, command), (next_observation, _) in itertools.pairwise(history)
                ]
                steps.append((history[-1][1], observation))
                memory = episode_memory(history[0][0], steps, task=task)
            else:
                memory = episode_memory(observation, [], task=task)
        return render_prompt(
            task,
            observation,
            admissible or (),
            history=history,
            step=len(history),
            history_length=options.history_length,
            think=options.think,
            memory=memory,
            style=options.style,
        )

    def reply_choices(self, *, style: str, think: bool) -> dict[str, str] | None:
        """The admissible-actions line of either style; none with reasoning (`think`)."""
        if think:
            return None
        if style == "compact":  # "Your admissible actions are: a, b, c."
            pattern, separator = r"Your admissible actions are: (.*)\.", ", "
        else:  # "Your admissible actions of the current situation are: ['a', 'b']."
            pattern = r"Your admissible actions of the current situation are: \['(.*)'\]\."
            separator = "', '"
        template = self.format_reply("{choice}", think=False)
        return {"pattern": pattern, "separator": separator, "template": template}

    def followup(self, observation, admissible, *, step, options: PromptOptions) -> str:
        return followup_text(
            observation, admissible or (), step=step, think=options.think, style=options.style
        )

    def fingerprint_parts(self, layout: str, options: PromptOptions) -> list[str]:
        # The papers' prompts hash as they did before the harness was an interface.
        return [
            SYSTEM_LINE,
            THINK_INSTRUCTIONS if options.think else ACTION_INSTRUCTIONS,
            followup_text("", [], step=0, think=options.think) if layout == "concat" else "",
        ]

    def read_prompt(self, text: str) -> tuple[str, list[str]]:
        """The task sentence ("Your task is to: X.") and every observation ("current
        observation is: ..." up to the admissible actions line) of a decoded context."""
        match = _TASK.search(text)
        observations = [m.strip() for m in _OBSERVATION.findall(text)]
        return (match.group(1) if match else ""), observations

    def task_type_of(self, task: str) -> str:
        """The ALFWorld task type whose sentence template `task` fits ("" if none)."""
        for task_type, pattern in _TASK_SENTENCES:
            if pattern.fullmatch(task):
                return task_type
        return ""


ALFWORLD_PROMPTS = AlfworldPrompts()
