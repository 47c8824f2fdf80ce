"""Which parameters train: regex patterns over nnx paths split a model into trainable / frozen.

A parameter trains when any pattern is found (`re.search`) in its "/"-joined path, e.g.
`layers/0/moe/experts/gate_proj`. Frozen parameters never reach the optimizer: they are passed
to the jitted steps as constants, so they stay bit-identical and cost no optimizer memory.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any

from flax import nnx


def path_string(path: Sequence[Any]) -> str:
    """An nnx path tuple as "layers/0/attn/q_proj/kernel"."""
    return "/".join(str(part) for part in path)


def compile_patterns(patterns: Sequence[str]) -> list[re.Pattern]:
    """The compiled regexes; ValueError naming the first that is not a regex."""
    compiled = []
    for pattern in patterns:
        try:
            compiled.append(re.compile(pattern))
        except re.error as error:
            raise ValueError(f"trainable pattern {pattern!r} is not a regex: {error}") from error
    return compiled


def trainable_filter(patterns: Sequence[str]) -> Callable[[tuple, Any], bool]:
    """An nnx filter `(path, value) -> bool`: a Param whose path matches one of `patterns`."""
    compiled = compile_patterns(patterns)

    def is_trainable(path: tuple, value: Any) -> bool:
        if not isinstance(value, nnx.Param):
            return False
        text = path_string(path)
        return any(regex.search(text) for regex in compiled)

    return is_trainable


def parameter_paths(module: nnx.Module) -> list[str]:
    """Every parameter path of `module`, sorted."""
    return sorted(path_string(p) for p, _ in nnx.to_flat_state(nnx.state(module, nnx.Param)))


def split_trainable(
    module: nnx.Module, patterns: Sequence[str], *, name: str = "model"
) -> tuple[nnx.GraphDef, nnx.State, nnx.State]:
    """(graphdef, trainable, frozen) with `nnx.merge(graphdef, trainable, frozen) == module`.

    Raises ValueError naming a pattern that matches no parameter (almost always a typo that would
    otherwise silently freeze what was meant to train), or when nothing would train.
    """
    if not patterns:
        raise ValueError(f"{name}: no trainable patterns, nothing would train")
    paths = parameter_paths(module)
    for pattern, regex in zip(patterns, compile_patterns(patterns), strict=True):
        if not any(regex.search(path) for path in paths):
            raise ValueError(
                f"{name}: trainable pattern {pattern!r} matches no parameter; paths look like "
                f"{paths[:4]} ... ({len(paths)} in all)"
            )
    graphdef, trainable, frozen = nnx.split(module, trainable_filter(patterns), ...)
    return graphdef, trainable, frozen


def state_paths(state: nnx.State) -> list[str]:
    """The "/"-joined paths of the variables in `state`, sorted."""
    return sorted(path_string(p) for p, _ in nnx.to_flat_state(state))
