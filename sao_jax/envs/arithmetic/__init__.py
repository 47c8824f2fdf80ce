"""A small tool-using arithmetic env: the agent may `calc <expression>` with a calculator
and ends with `answer <number>` (reward 1 if right). Deterministic tasks per (split, index);
`valid_unseen` has larger numbers and a longer mixed form. Registered as "arithmetic"."""

from sao_jax.envs.arithmetic.calculator import CalculatorError, evaluate_expression
from sao_jax.envs.arithmetic.env import EXPERTS, ArithmeticEnv
from sao_jax.envs.arithmetic.prompts import ARITHMETIC_PROMPTS, ArithmeticPrompts
from sao_jax.envs.arithmetic.tasks import SPLITS, TASK_TYPES, ArithmeticTask, make_task

__all__ = [
    "ARITHMETIC_PROMPTS",
    "EXPERTS",
    "SPLITS",
    "TASK_TYPES",
    "ArithmeticEnv",
    "ArithmeticPrompts",
    "ArithmeticTask",
    "CalculatorError",
    "evaluate_expression",
    "make_task",
]
