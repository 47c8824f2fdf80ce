"""Field checks shared by the ATDP record types; every error names the field's path."""

from __future__ import annotations

import math
import re
from enum import StrEnum
from typing import Any

import numpy as np

_TENANT_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


class SchemaError(ValueError):
    """A record violates the ATDP schema; the message starts with the field's path."""


def fail(path: str, problem: str) -> SchemaError:
    return SchemaError(f"{path}: {problem}")


def check_str(path: str, value: Any, *, nonempty: bool = False, max_chars: int = 0) -> None:
    if not isinstance(value, str):
        raise fail(path, f"expected str, got {type(value).__name__}")
    if nonempty and not value:
        raise fail(path, "must not be empty")
    if max_chars and len(value) > max_chars:
        raise fail(path, f"longer than {max_chars} characters")


def check_enum(path: str, value: Any, enum: type[StrEnum]) -> None:
    if not isinstance(value, enum):
        choices = ", ".join(m.value for m in enum)
        raise fail(path, f"expected {enum.__name__} ({choices}), got {value!r}")


def check_finite(path: str, value: Any, *, optional: bool = False, nonneg: bool = False) -> None:
    if value is None and optional:
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise fail(path, f"expected a number, got {type(value).__name__}")
    if not math.isfinite(value):
        raise fail(path, f"must be finite, got {value}")
    if nonneg and value < 0:
        raise fail(path, f"must be >= 0, got {value}")


def check_int(path: str, value: Any, *, optional: bool = False, minimum: int | None = None):
    if value is None and optional:
        return
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise fail(path, f"expected int, got {type(value).__name__}")
    if minimum is not None and value < minimum:
        raise fail(path, f"must be >= {minimum}, got {value}")


def check_tenant_id(tenant: Any, path: str = "tenant") -> None:
    """Tenant ids name storage partitions, so they are restricted to a path-safe alphabet."""
    check_str(path, tenant, nonempty=True)
    if not _TENANT_RE.match(tenant):
        raise fail(path, f"{tenant!r} must match {_TENANT_RE.pattern} (letters, digits, _ . -)")


def as_array(path: str, value: Any, dtype: type, *, allow_none: bool = False) -> np.ndarray | None:
    if value is None and allow_none:
        return None
    array = np.asarray(value)
    if array.ndim != 1:
        raise fail(path, f"expected a 1-D sequence, got shape {array.shape}")
    if (
        array.size
        and np.issubdtype(dtype, np.integer)
        and not np.issubdtype(array.dtype, np.integer)
    ):
        raise fail(path, f"expected integers, got dtype {array.dtype}")
    return np.ascontiguousarray(array, dtype=dtype)
