"""Command lines built from the services' config dataclasses.

Each field becomes `--field-name` (or the flag named in its metadata); `bool` fields get
`--x` / `--no-x`; `X | None` fields accept the literal `none`. Field docs come from the
dataclass's docstring `Attributes:` section.
"""

from __future__ import annotations

import argparse
import dataclasses
import re
import types
import typing
from collections.abc import Sequence
from typing import Any, TypeVar

T = TypeVar("T")


def _field_docs(cls: type) -> dict[str, str]:
    docs, current = {}, None
    for line in (cls.__doc__ or "").splitlines():
        match = re.match(r"\s{2,}(\w+): (.*)", line)
        if match:
            current = match.group(1)
            docs[current] = match.group(2).strip()
        elif current and line.strip():
            docs[current] += " " + line.strip()
        else:
            current = None
    return docs


def _base_type(tp: Any) -> tuple[Any, bool]:
    """(the non-None type, whether None is allowed)."""
    if isinstance(tp, types.UnionType) or typing.get_origin(tp) is typing.Union:
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return args[0], True
    return tp, False


def _converter(tp: Any, optional: bool):
    def convert(text: str) -> Any:
        if optional and text.lower() == "none":
            return None
        if tp is int:
            return int(text)
        if tp is float:
            return float(text)
        if typing.get_origin(tp) is tuple:
            return tuple(part for part in text.split(",") if part)
        return text

    return convert


def dataclass_parser(
    cls: type, description: str, prog: str | None = None
) -> argparse.ArgumentParser:
    """An argparse parser with one option per field of the dataclass `cls`."""
    parser = argparse.ArgumentParser(prog=prog, description=description)
    docs = _field_docs(cls)
    hints = typing.get_type_hints(cls)
    for field in dataclasses.fields(cls):
        flag = field.metadata.get("flag", "--" + field.name.replace("_", "-"))
        default = field.default if field.default is not dataclasses.MISSING else None
        if field.default_factory is not dataclasses.MISSING:
            default = field.default_factory()
        tp, optional = _base_type(hints[field.name])
        help_text = docs.get(field.name, "") + f" (default: {default})"
        if tp is bool:
            parser.add_argument(
                flag,
                dest=field.name,
                action=argparse.BooleanOptionalAction,
                default=default,
                help=help_text,
            )
        else:
            parser.add_argument(
                flag,
                dest=field.name,
                type=_converter(tp, optional),
                default=default,
                help=help_text,
            )
    return parser


def parse_config(
    cls: type[T], argv: Sequence[str] | None, description: str, prog: str | None = None
) -> T:
    """The dataclass `cls` filled from `argv` (exits 2 with a usage message on bad input)."""
    parser = dataclass_parser(cls, description, prog)
    args = parser.parse_args(argv)
    try:
        return cls(**vars(args))
    except (TypeError, ValueError) as error:
        parser.error(str(error))
        raise  # unreachable: parser.error exits
