"""The calculator tool: integer expressions with + - * and parentheses, parsed without eval."""

from __future__ import annotations

import re

MAX_CHARS = 80
MAX_VALUE = 10**12
_TOKEN = re.compile(r"\s*(\d+|[-+*()])")


class CalculatorError(ValueError):
    """An expression the calculator cannot read (the message says what is wrong)."""


def tokenize(expression: str) -> list[str]:
    """The numbers and operators of `expression`; a CalculatorError for anything else."""
    if len(expression) > MAX_CHARS:
        raise CalculatorError(f"the expression is longer than {MAX_CHARS} characters")
    tokens, position = [], 0
    expression = expression.rstrip()
    while position < len(expression):
        match = _TOKEN.match(expression, position)
        if match is None:
            raise CalculatorError(f"it cannot read {expression[position:].strip()!r}")
        tokens.append(match.group(1))
        position = match.end()
    if not tokens:
        raise CalculatorError("the expression is empty")
    return tokens


def evaluate_expression(expression: str) -> int:
    """The value of `expression` (grammar: sum := product (+|- product)*,
    product := factor (* factor)*, factor := number | -factor | (sum))."""
    tokens = tokenize(expression)
    value, position = _sum(tokens, 0)
    if position != len(tokens):
        raise CalculatorError(f"unexpected {tokens[position]!r}")
    return value


def normalized(expression: str) -> str:
    """The expression as the calculator echoes it: tokens separated by single spaces."""
    return " ".join(tokenize(expression))


def _checked(value: int) -> int:
    if abs(value) > MAX_VALUE:
        raise CalculatorError(f"the result is beyond {MAX_VALUE}")
    return value


def _sum(tokens: list[str], position: int) -> tuple[int, int]:
    value, position = _product(tokens, position)
    while position < len(tokens) and tokens[position] in "+-":
        operator = tokens[position]
        right, position = _product(tokens, position + 1)
        value = _checked(value + right if operator == "+" else value - right)
    return value, position


def _product(tokens: list[str], position: int) -> tuple[int, int]:
    value, position = _factor(tokens, position)
    while position < len(tokens) and tokens[position] == "*":
        right, position = _factor(tokens, position + 1)
        value = _checked(value * right)
    return value, position


def _factor(tokens: list[str], position: int) -> tuple[int, int]:
    if position >= len(tokens):
        raise CalculatorError("the expression ends too early")
    token = tokens[position]
    if token.isdigit():
        return _checked(int(token)), position + 1
    if token == "-":
        value, position = _factor(tokens, position + 1)
        return -value, position
    if token == "(":
        value, position = _sum(tokens, position + 1)
        if position >= len(tokens) or tokens[position] != ")":
            raise CalculatorError("a '(' is never closed")
        return value, position + 1
    raise CalculatorError(f"unexpected {token!r}")
