"""The arithmetic env: answer a question, optionally using a calculator tool first.

Actions (one per step, plain text):
  calc <expression>  the observation is "<expression> = <value>" (integers, + - * and
                     brackets); an expression the calculator cannot read is refused.
  answer <number>    ends the episode: reward 1.0 if the number is the task's answer.
Anything else is refused ("Unknown action ..."); a refused action (info["admissible"] False)
costs a step and the episode goes on. An episode ends at the answer or after `max_steps`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

from sao_jax.envs.arithmetic.calculator import (
    MAX_CHARS,
    CalculatorError,
    evaluate_expression,
    normalized,
)
from sao_jax.envs.arithmetic.prompts import ARITHMETIC_PROMPTS
from sao_jax.envs.arithmetic.tasks import (
    NAMES,
    SPLITS,
    TASK_TYPES,
    THINGS,
    WORD_TEMPLATES,
    ArithmeticTask,
    check_task_args,
    make_task,
)
from sao_jax.envs.base import PromptOptions, TaskSampler, TextEnv

EXPERTS = ("search",)
OPENING = "The calculator is ready."
UNKNOWN_ACTION = "Unknown action. Use calc <expression> or answer <number>."
NOT_A_NUMBER = "The answer must be a whole number."
_ANSWER = re.compile(r"-?\d+")


class ArithmeticEnv(TextEnv):
    """One arithmetic task at a time (`tasks.make_task`); see the module docstring for rules.

    Info (reset and step): task (the question), task_id, task_type, admissible_commands
    (None: the actions are free text), won, steps; on step also `admissible` and `tool`
    ("calc", "answer" or None for a refused action).

    expert: "search", the solver: `calc` the task's expression, then `answer` the value the
      calculator showed (only the episode's texts and the task decide its actions).
    """

    name = "arithmetic"
    splits = SPLITS
    experts = EXPERTS
    task_types = TASK_TYPES
    harness = ARITHMETIC_PROMPTS

    def __init__(
        self,
        split: str = "train",
        *,
        max_steps: int = 4,
        seed: int = 0,
        indices: Sequence[int] | None = None,
        sampler: TaskSampler | None = None,
        expert: str = "search",
    ):
        check_task_args(split, 0)
        if expert not in EXPERTS:
            raise ValueError(f"unknown expert {expert!r}; expected one of {EXPERTS}")
        if not isinstance(max_steps, int) or max_steps < 1:
            raise ValueError(f"max_steps must be a positive int, got {max_steps!r}")
        if sampler is not None and sampler.split != split:
            raise ValueError(f"sampler draws from {sampler.split!r} but the env plays {split!r}")
        self.split, self.max_steps, self.expert = split, max_steps, expert
        self.sampler = sampler or TaskSampler(split, SPLITS[split], seed=seed, indices=indices)
        self.task: ArithmeticTask | None = None
        self.steps, self.done, self.won = 0, True, False
        self.transcript: list[tuple[str, str]] = []  # (action, observation) per step

    @classmethod
    def from_config(cls, config, sampler: TaskSampler) -> ArithmeticEnv:
        """The env of an `EnvConfig` (split, max_steps, expert; size and phrasing unused)."""
        return cls(config.split, max_steps=config.max_steps, sampler=sampler, expert=config.expert)

    @classmethod
    def from_task_spec(cls, spec: Mapping, *, expert: str | None = None) -> ArithmeticEnv:
        return cls(spec["split"], max_steps=int(spec["max_steps"]), expert=expert or EXPERTS[0])

    @classmethod
    def vocabulary(cls) -> list[str]:
        """Every word and symbol of its prompts, observations and actions (numbers are
        digits: a word tokenizer splits them)."""
        texts = [OPENING, UNKNOWN_ACTION, NOT_A_NUMBER, _CORRECT.format(1), _WRONG.format(1)]
        for bad in ("", "1 +", "(1", "1 )", "'x'", "9" * (MAX_CHARS + 1), "99999999 * 99999999"):
            try:
                evaluate_expression(bad)
            except CalculatorError as error:
                texts.append(_REFUSED.format(reason=error))
        texts += [
            template.format(name=name, thing=thing, a=1, b=2)
            for _, template in WORD_TEMPLATES
            for name in NAMES
            for thing in THINGS
        ]
        texts += ["What is 0 1 2 3 4 5 6 7 8 9 + - * ( ) ?", "calc answer = -"]
        history = [(OPENING, "calc 1")] * 2
        for style in ("paper", "compact"):
            for think in (False, True):
                options = PromptOptions(history_length=1, think=think, style=style)
                texts.append(ARITHMETIC_PROMPTS.prompt("1", OPENING, None, history, options))
                texts.append(ARITHMETIC_PROMPTS.followup(OPENING, None, step=1, options=options))
        words = {w for text in texts for w in re.findall(r"\w+|[^\w\s]", text)}
        words = {w for w in words if not w.isdigit() or len(w) == 1}  # numbers are digits
        # a reply's action is lower-cased, and an unreadable one is quoted back
        return sorted(words | {w.lower() for w in words})

    def reset(self, index: int | None = None) -> tuple[str, dict]:
        """Start task `index` of the split (None: the sampler's next)."""
        index = self.sampler.next_index() if index is None else index
        self.task = make_task(self.split, index)
        self.steps, self.done, self.won, self.transcript = 0, False, False, []
        return OPENING, self._info()

    def step(self, action: str) -> tuple[str, float, bool, dict]:
        if self.done or self.task is None:
            raise RuntimeError("episode is over: call reset() first")
        verb, _, argument = action.strip().partition(" ")
        tool: str | None = None
        if verb == "calc":
            try:
                value = evaluate_expression(argument)
                observation, tool = f"{normalized(argument)} = {value}", "calc"
            except CalculatorError as error:
                observation = _REFUSED.format(reason=error)
        elif verb == "answer":
            if _ANSWER.fullmatch(argument.strip()):
                self.won = int(argument) == self.task.answer
                observation, tool = (
                    (_CORRECT if self.won else _WRONG).format(argument.strip()),
                    "answer",
                )
            else:
                observation = NOT_A_NUMBER
        else:
            observation = UNKNOWN_ACTION
        self.transcript.append((action, observation))
        self.steps += 1
        self.done = tool == "answer" or self.steps >= self.max_steps
        info = self._info()
        info["admissible"], info["tool"] = tool is not None, tool
        return observation, float(self.won), self.done, info

    def expert_action(self) -> str | None:
        """calc the task's expression, then answer the last value the calculator showed."""
        if self.task is None:
            raise RuntimeError("no task yet: call reset() first")
        if self.won:
            return None
        for _, observation in reversed(self.transcript):
            if " = " in observation:
                return f"answer {observation.rsplit(' = ', 1)[1]}"
        return f"calc {self.task.expression}"

    def _info(self) -> dict:
        task = self.task
        return {
            "task": task.text,
            "task_id": task.task_id,
            "task_type": task.task_type,
            "admissible_commands": None,
            "won": self.won,
            "steps": self.steps,
        }


_CORRECT = "Correct: {} is the answer."
_WRONG = "Wrong: {} is not the answer."
_REFUSED = "The calculator refused: {reason}."
