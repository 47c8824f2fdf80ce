"""End-of-run summary tables for the terminal."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import jax
from tabulate import tabulate

from sao_jax.metrics.writer import encode_value, flatten_metrics, to_scalar

SUMMARY_FILE = "summary.json"


def _cell(value: Any, floatfmt: str) -> Any:
    # Formatted here because tabulate leaves floats unformatted in mixed-type columns.
    if isinstance(value, float) and not isinstance(value, bool):
        return format(value, floatfmt)
    return value


def summary_table(
    rows: Mapping[str, Any] | Sequence[Mapping[str, Any]],
    *,
    floatfmt: str = ".4g",
    tablefmt: str = "simple",
    numparse: bool = True,
) -> str:
    """A text table.

    `rows` is either one mapping (printed as `metric | value` lines) or a list of mappings
    (one row each; columns are the union of keys in first-seen order, blanks where absent),
    e.g. one row per algorithm or per task type. Floats are written with `floatfmt`;
    `numparse=False` prints every string cell as written (tabulate otherwise reads a string
    like "+0.017" as a number and drops its sign), right-aligned after the first column.
    """
    if isinstance(rows, Mapping):
        if not rows:
            raise ValueError("summary_table needs at least one metric")
        return tabulate(
            [[k, _cell(v, floatfmt)] for k, v in rows.items()],
            headers=["metric", "value"],
            floatfmt=floatfmt,
            tablefmt=tablefmt,
            disable_numparse=not numparse,
            colalign=None if numparse else ("left", "right"),
        )
    rows = list(rows)
    if not rows:
        raise ValueError("summary_table needs at least one row")
    for index, row in enumerate(rows):
        if not isinstance(row, Mapping):
            raise TypeError(f"row {index} is {type(row).__name__}; expected a dict")
    columns = list(dict.fromkeys(key for row in rows for key in row))
    table = [[_cell(row.get(column, ""), floatfmt) for column in columns] for row in rows]
    return tabulate(
        table,
        headers=columns,
        floatfmt=floatfmt,
        tablefmt=tablefmt,
        disable_numparse=not numparse,
        colalign=None if numparse else ("left", *["right"] * (len(columns) - 1)),
    )


def json_ready(value: Any, name: str = "") -> Any:
    """`value` for `json.dumps(..., allow_nan=False)`, with numbers as in metrics.jsonl:
    non-finite floats as "nan" / "inf", 0-d arrays as numbers, mappings (keys as strings) and
    sequences kept; anything else a ValueError naming where it sits (`name`)."""
    if isinstance(value, Mapping):
        return {str(k): json_ready(v, f"{name}/{k}" if name else str(k)) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_ready(v, f"{name}[{i}]") for i, v in enumerate(value)]
    return encode_value(to_scalar(name, value))


def save_summary(out_dir: str | os.PathLike, summary: Mapping[str, Any]) -> Path | None:
    """Write `out_dir/summary.json` (numbers as in metrics.jsonl: non-finite as "nan"/"inf",
    0-d arrays as numbers, nested dicts kept) and return its path.

    Only process 0 writes (like `MetricsWriter`); elsewhere the summary is validated the same
    way, nothing is written and None is returned.
    """

    flatten_metrics(summary)  # validates the keys
    text = json.dumps(json_ready(summary), indent=2, allow_nan=False)
    if jax.process_index() != 0:
        return None
    path = Path(out_dir) / SUMMARY_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text + "\n")
    return path
