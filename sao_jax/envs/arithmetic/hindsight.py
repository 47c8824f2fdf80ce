"""The arithmetic env's rule-based hindsight (SEED's `HindsightRules` for `rule_arithmetic`).

From the task (its spec, or its text alone: a learner batch or served traffic carries no spec)
and a replay of the episode's actions in the env, short regular sentences of three kinds:

- fact: "The result of 12 * 7 is 84." and each wrong answer the episode revealed
  ("83 is not the answer.");
- failed_command: the first actions the env refused or that lost, with the fix ("'answer 83'
  is wrong: calc 12 * 7 first.", "'calc 12 x 7' is wrong: the calculator cannot read it.");
- procedure: "calc 12 * 7, then answer 84."

Every word is in the env's vocabulary (`ArithmeticEnv.vocabulary`). Plain data in and out:
this module does not import `sao_jax.seed` (which depends on the envs).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import ClassVar

from sao_jax.envs.arithmetic.calculator import CalculatorError, evaluate_expression
from sao_jax.envs.arithmetic.env import NOT_A_NUMBER, UNKNOWN_ACTION, ArithmeticEnv
from sao_jax.envs.arithmetic.tasks import SPLITS, WORD_TEMPLATES, ArithmeticTask, make_task

MAX_FAILED = 2
_OPERATOR = {"add": "+", "sub": "-", "mul": "*"}
_FIELD = re.compile(r"\{(\w+)\}")


def _template_regex(template: str) -> re.Pattern:
    """A regex reading a word template's fields back (a repeated field must repeat its value)."""
    out, named, position = [], set(), 0
    for match in _FIELD.finditer(template):
        out.append(re.escape(template[position : match.start()]))
        field = match.group(1)
        if field in named:
            out.append(f"(?P={field})")
        else:
            named.add(field)
            out.append(rf"(?P<{field}>\d+)" if field in "ab" else rf"(?P<{field}>\w+)")
        position = match.end()
    out.append(re.escape(template[position:]))
    return re.compile("".join(out) + "$")


_WORD_REGEXES = [(operation, _template_regex(t)) for operation, t in WORD_TEMPLATES]


def task_of(spec: Mapping | None, text: str) -> ArithmeticTask:
    """The episode's task: from its spec (split, index), else read from its text."""
    if spec and "split" in spec and "index" in spec:
        return make_task(spec["split"], int(spec["index"]))
    text = text.strip()
    expression = None
    if text.startswith("What is ") and text.endswith("?"):
        expression = text[len("What is ") : -1].strip()
    for operation, regex in _WORD_REGEXES:
        match = regex.match(text)
        if match:
            expression = f"{match['a']} {_OPERATOR[operation]} {match['b']}"
    if expression is None:
        raise ValueError(f"not an arithmetic task: {text!r}")
    try:
        value = evaluate_expression(expression)
    except CalculatorError as error:
        raise ValueError(f"not an arithmetic task: {text!r} ({error})") from error
    return ArithmeticTask("train", -1, "", text, expression, value)


def _replay(task: ArithmeticTask, actions: Sequence[str]) -> list[tuple[str, str, bool]]:
    """(action, observation, the expert's action there) per step, until the episode ends."""
    split = task.split if task.split in SPLITS else "train"
    env = ArithmeticEnv(split, max_steps=max(len(actions), 1))
    # the env's reset, with this task (one read from text has no index)
    env.task, env.steps, env.done, env.won, env.transcript = task, 0, False, False, []
    out = []
    for action in actions:
        if env.done:
            break
        expected = env.expert_action()
        observation, _, _, _ = env.step(action)
        out.append((action, observation, action == expected))
    return out


class ArithmeticHindsight:
    """The `HindsightRules` of the arithmetic env (see the module docstring)."""

    env = "arithmetic"
    version = "arithmetic-rules-v1"
    kind_patterns: ClassVar[dict[str, str]] = {
        "fact": r"(?:The result of .+ is -?\d|-?\d+ is (?:not )?the answer\.)",
        "failed_command": r"(?:'[^']*' is wrong: |Step \d+ is wrong: )",
        "procedure": r"calc .+, then answer ",
    }

    def hindsight(
        self, spec: Mapping | None, task: str, actions: Sequence[str], success: bool
    ) -> list[tuple[str, str]]:
        solved = task_of(spec, task)
        expression, answer = solved.expression, solved.answer
        facts = [f"The result of {expression} is {answer}."]
        failed, calculated = [], False
        for step, (action, observation, _) in enumerate(_replay(solved, actions), start=1):
            verb, _, argument = action.partition(" ")
            if observation.endswith(f" = {answer}"):
                calculated = True
            if not action:
                failed.append(
                    f"Step {step} is wrong: give one action within <action> </action> tags."
                )
            elif observation == UNKNOWN_ACTION:
                failed.append(f"'{action}' is wrong: use calc <expression> or answer <number>.")
            elif observation == NOT_A_NUMBER:
                failed.append(f"'{action}' is wrong: the answer must be a whole number.")
            elif verb == "calc" and observation.startswith("The calculator refused"):
                failed.append(f"'{action}' is wrong: the calculator cannot read it.")
            elif verb == "answer" and observation.startswith("Wrong"):
                facts.append(f"{argument.strip()} is not the answer.")
                fix = (
                    "answer the value the calculator shows"
                    if calculated
                    else (f"calc {expression} first")
                )
                failed.append(f"'{action}' is wrong: {fix}.")
        facts = [("fact", s) for s in dict.fromkeys(facts)]
        failed = [("failed_command", s) for s in list(dict.fromkeys(failed))[:MAX_FAILED]]
        # most important first (a skill over its token budget drops the last ones)
        procedure = [("procedure", f"calc {expression}, then answer {answer}.")]
        return facts[:1] + failed[:1] + procedure + facts[1:] + failed[1:]

    def action_labels(self, spec: Mapping | None, task: str, actions: Sequence[str]) -> list[bool]:
        solved = task_of(spec, task)
        labels = []
        for action, observation, expected in _replay(solved, actions):
            right_value = observation.endswith(f" = {solved.answer}") or observation.startswith(
                "Correct"
            )
            labels.append(bool(action) and (expected or right_value))
        return labels


ARITHMETIC_RULES = ArithmeticHindsight()
