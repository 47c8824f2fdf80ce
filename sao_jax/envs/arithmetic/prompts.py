"""The prompts of the arithmetic env (`ArithmeticPrompts`, its `PromptHarness`).

Each prompt has a line per fact (task, earlier steps, current observation, the two actions),
so `read_prompt` finds them again in a decoded context; the reply is `<action>...</action>`
(after `<think>...</think>` with think), read by the shared `parse_reply`.
"""

from __future__ import annotations

import re

from sao_jax.envs.base import PromptHarness, PromptOptions

SYSTEM_LINE = "You are an agent that solves arithmetic tasks with a calculator."
ACTIONS_LINE = (
    "Actions: calc <expression> shows the value of an expression with + - * and brackets; "
    "answer <number> gives your final answer and ends the task."
)
THINK_INSTRUCTIONS = (
    "First reason step by step within <think> </think> tags, then give one action within "
    "<action> </action> tags."
)
ACTION_INSTRUCTIONS = "Give one action within <action> </action> tags."
_TASK = re.compile(r"^Task: (.*)$", re.MULTILINE)
_OBSERVATION = re.compile(r"^Current observation: (.*)$", re.MULTILINE)


class ArithmeticPrompts(PromptHarness):
    """Windowed prompt: (paper style: the system line,) the task, the last h steps, the step
    count and current observation, the actions line (paper: and the reply instructions).
    Concat follow-up: the step count and the observation (paper: and the instructions)."""

    name = "arithmetic"

    def prompt(self, task, observation, admissible, history, options: PromptOptions) -> str:
        paper = options.style == "paper"
        lines = [SYSTEM_LINE] if paper else []
        lines.append(f"Task: {task}")
        h = options.history_length
        shown = list(history)[max(0, len(history) - h) :] if h else []
        first = len(history) - len(shown) + 1
        lines += [
            f"Step {first + k}: {obs} Action: {action}" for k, (obs, action) in enumerate(shown)
        ]
        lines.append(f"Step {len(history) + 1}.")
        lines.append(f"Current observation: {observation}")
        lines.append(ACTIONS_LINE)
        if paper:
            lines.append(THINK_INSTRUCTIONS if options.think else ACTION_INSTRUCTIONS)
        return "\n".join(lines)

    def followup(self, observation, admissible, *, step: int, options: PromptOptions) -> str:
        lines = [f"Step {step + 1}.", f"Current observation: {observation}"]
        if options.style == "paper":
            lines.append(THINK_INSTRUCTIONS if options.think else ACTION_INSTRUCTIONS)
        return "\n".join(lines)

    def fingerprint_parts(self, layout: str, options: PromptOptions) -> list[str]:
        instructions = THINK_INSTRUCTIONS if options.think else ACTION_INSTRUCTIONS
        return [SYSTEM_LINE, ACTIONS_LINE, instructions, "arithmetic-prompts-v1"]

    def read_prompt(self, text: str) -> tuple[str, list[str]]:
        match = _TASK.search(text)
        observations = [m.strip() for m in _OBSERVATION.findall(text)]
        return (match.group(1).strip() if match else ""), observations

    def task_type_of(self, task: str) -> str:
        """The task type a task text was made by ("" if none of ours)."""
        if not task.startswith("What is "):
            return "word" if task.endswith("?") and " has " in task else ""
        operators = [c for c in task[len("What is ") : -1] if c in "+-*"]
        if len(operators) > 1:
            return "mixed"
        return {"+": "add", "-": "sub", "*": "mul"}.get("".join(operators), "")


ARITHMETIC_PROMPTS = ArithmeticPrompts()
