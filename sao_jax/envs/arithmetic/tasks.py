"""Arithmetic tasks: expressions and word problems, a pure function of (split, index).

Task types (the same in every split): "add", "sub", "mul", "mixed" (two operations) and "word"
(a word problem over one operation). `train` and `valid_seen` draw operands from the same
ranges; `valid_unseen` uses larger operands and a three-operation form of "mixed", so it
measures generalisation beyond the training distribution.
"""

from __future__ import annotations

import dataclasses

from sao_jax.envs.arithmetic.calculator import evaluate_expression
from sao_jax.envs.rng import StableRng

TASK_TYPES = ("add", "sub", "mul", "mixed", "word")
SPLITS = {"train": 2000, "valid_seen": 100, "valid_unseen": 100}
NAMES = ("Ann", "Bob", "Sue", "Tom")
THINGS = ("apples", "books", "coins", "pens")
# (task type of the operation, template); {name}, {a}, {b}, {thing} are filled in.
WORD_TEMPLATES = (
    ("add", "{name} has {a} {thing} and gets {b} more. How many {thing} does {name} have now?"),
    ("sub", "{name} has {a} {thing} and gives away {b}. How many {thing} are left?"),
    ("mul", "{name} has {a} bags with {b} {thing} in each bag. How many {thing} in all?"),
)
_OPERATOR = {"add": "+", "sub": "-", "mul": "*"}


@dataclasses.dataclass(frozen=True)
class ArithmeticTask:
    """One task: the text the agent reads, the expression that solves it, and its value."""

    split: str
    index: int
    task_type: str
    text: str
    expression: str
    answer: int

    @property
    def task_id(self) -> str:
        return f"arithmetic-{self.split}-{self.index}"


def check_task_args(split: str, index: int) -> None:
    """A ValueError / IndexError naming the bad split or index and the accepted values."""
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; expected one of {tuple(SPLITS)}")
    if not isinstance(index, int) or not 0 <= index < SPLITS[split]:
        raise IndexError(
            f"{split} has {SPLITS[split]} tasks (0..{SPLITS[split] - 1}), got {index!r}"
        )


def make_task(split: str, index: int) -> ArithmeticTask:
    """Task `index` of `split` (identical in every process: stable hashing only)."""
    check_task_args(split, index)
    rng = StableRng("arithmetic", split, index)
    unseen = split == "valid_unseen"
    task_type = TASK_TYPES[index % len(TASK_TYPES)]  # every type equally often, in any prefix
    small, large = ((13, 99), (100, 999)) if unseen else ((2, 12), (2, 99))
    if task_type in _OPERATOR:
        a, b = rng.between(*large), rng.between(*(small if task_type == "mul" else large))
        if task_type == "sub" and b > a:
            a, b = b, a
        expression = f"{a} {_OPERATOR[task_type]} {b}"
        text = f"What is {expression}?"
    elif task_type == "mixed":
        a, b, c = rng.between(*small), rng.between(*small), rng.between(*large)
        if unseen:
            d = rng.between(*small)
            expression = f"({c} + {a}) * {b} - {d}"
        else:
            expression = f"{a} * {b} + {c}"
        text = f"What is {expression}?"
    else:
        operation, template = rng.choice(WORD_TEMPLATES)
        a, b = rng.between(*large), rng.between(*(small if operation == "mul" else large))
        if operation == "sub" and b > a:
            a, b = b, a
        name, thing = rng.choice(NAMES), rng.choice(THINGS)
        text = template.format(name=name, thing=thing, a=a, b=b)
        expression = f"{a} {_OPERATOR[operation]} {b}"
    return ArithmeticTask(
        split, index, task_type, text, expression, evaluate_expression(expression)
    )
